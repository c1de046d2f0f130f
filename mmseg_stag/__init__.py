"""STAG for online test-time adaptation, as an MMSegmentation 1.x plugin."""
import importlib.util

from .versions import check_versions

# before the submodules: an older torch fails there less clearly
check_versions()

from . import classification, engine  # noqa: F401,E402  (registers them)
from .core import STAGLoss, stag  # noqa: E402
from .core.stag import (sample_sensitivity, stag_beta, stag_loss,  # noqa: E402
                        structural_anchors)

if importlib.util.find_spec('mmseg') is not None:
    # an installed MMSeg that fails to import is a real error: not hidden
    from . import segmentation  # noqa: F401

__version__ = '0.3.0'

__all__ = [
    'STAGLoss', 'stag', 'stag_beta', 'stag_loss', 'structural_anchors',
    'sample_sensitivity', '__version__'
]
