from ..registry import METHODS
from .base import BaseMethod


@METHODS.register_module(name='source')
class Source(BaseMethod):
    """The source model, unchanged: no update, evaluation mode (``stag``,
    ``optimizer`` and ``trainable`` refused: nothing to update)."""

    has_base_loss = False

    def __init__(self, stag=None, **kwargs):
        if stag is not None:
            raise ValueError('source does not adapt: remove the stag option '
                             '(use bn_adapt or tent with stag)')
        for option in ('optimizer', 'trainable'):
            if kwargs.get(option) is not None:
                raise ValueError(f'source does not adapt, so nothing uses '
                                 f'its {option} option: remove it')
        super().__init__(stag=None, **kwargs)
