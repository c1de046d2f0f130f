"""mmseg_stag: STAG (Structural Test-time Alignment of Gradients) for MMSeg 1.x.

Importing the package registers its components in MMSeg's registries, so a
config only needs ``custom_imports=dict(imports=['mmseg_stag'])``.
"""
from . import datasets, engine, evaluation, losses, methods, models  # noqa
from .losses import STAGLoss
from .stag import (stag_beta, stag_loss, structural_anchors,
                   sample_sensitivity)

__version__ = '0.1.0'

__all__ = [
    'STAGLoss', 'stag_beta', 'stag_loss', 'structural_anchors',
    'sample_sensitivity', '__version__'
]
