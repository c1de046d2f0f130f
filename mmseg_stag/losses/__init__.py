from .stag_loss import STAGLoss

__all__ = ['STAGLoss']
