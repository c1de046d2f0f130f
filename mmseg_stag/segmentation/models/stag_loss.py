"""``STAGLoss`` in MMSeg's ``MODELS``, where MMSeg configs build their
losses: the core's plain ``nn.Module`` (mmseg_stag/core/stag_loss.py, which
cannot import MMSeg), registered here once, so that after ``import
mmseg_stag`` (or ``custom_imports=dict(imports=['mmseg_stag'])``)
``MODELS.build(dict(type='STAGLoss'))`` builds it."""
from mmseg.registry import MODELS

from mmseg_stag.core.stag_loss import STAGLoss

MODELS.register_module(module=STAGLoss)

__all__ = ['STAGLoss']
