from .tta_hook import TTAHook

__all__ = ['TTAHook']
