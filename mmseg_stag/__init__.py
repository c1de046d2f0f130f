"""mmseg_stag: STAG (Structural Test-time Alignment of Gradients) for online
test-time adaptation, as an MMSegmentation 1.x plugin.

``mmseg_stag.core`` (STAG math and loss, head probe, methods),
``mmseg_stag.engine`` (the online loop) and ``mmseg_stag.classification``
need neither MMSeg nor MMCV. When MMSeg is installed, importing the package
also registers the segmentation parts in MMSeg's registries
(``mmseg_stag.segmentation``), so a config only needs
``custom_imports=dict(imports=['mmseg_stag'])``; an installed MMSeg that
cannot be imported (e.g. MMCV missing) raises its own import error.
"""
import importlib.util

from . import classification, engine  # noqa: F401  (registers them)
from .core import STAGLoss, stag
from .core.stag import (sample_sensitivity, stag_beta, stag_loss,
                        structural_anchors)

if importlib.util.find_spec('mmseg') is not None:
    # MMSeg is there: register its parts (an import error here is real)
    from . import segmentation  # noqa: F401

__version__ = '0.3.0'

__all__ = [
    'STAGLoss', 'stag', 'stag_beta', 'stag_loss', 'structural_anchors',
    'sample_sensitivity', '__version__'
]
