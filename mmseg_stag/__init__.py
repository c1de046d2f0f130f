"""STAG for online test-time adaptation, as an MMSegmentation 1.x plugin."""
import importlib.util

from . import classification, engine  # noqa: F401  (registers them)
from .core import STAGLoss, stag
from .core.stag import (sample_sensitivity, stag_beta, stag_loss,
                        structural_anchors)

if importlib.util.find_spec('mmseg') is not None:
    # an installed MMSeg that fails to import is a real error: not hidden
    from . import segmentation  # noqa: F401

__version__ = '0.3.0'

__all__ = [
    'STAGLoss', 'stag', 'stag_beta', 'stag_loss', 'structural_anchors',
    'sample_sensitivity', '__version__'
]
