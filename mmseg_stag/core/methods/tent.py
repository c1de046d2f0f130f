from ..losses import (mean_over_outputs, pseudo_label_cross_entropy,
                      softmax_entropy)
from ..registry import METHODS
from .base import BaseMethod


@METHODS.register_module(name='tent')
class TENT(BaseMethod):
    """TENT (Wang et al., ICLR 2021): minimise the prediction entropy.

    Follows DequanWang/tent's tent.py (forward_and_adapt), in eval mode.

    Args:
        loss (str): ``'entropy'`` (eq:ent) or ``'pseudo_ce'`` (cross-entropy
            to the own argmax). Default: ``'entropy'``.
        **kwargs: See :class:`BaseMethod`.

    Raises:
        ValueError: If ``loss`` is unknown.
    """

    LOSSES = ('entropy', 'pseudo_ce')
    graph_capturable = True

    def __init__(self, loss: str = 'entropy', **kwargs):
        if loss not in self.LOSSES:
            raise ValueError(f'tent loss must be one of {self.LOSSES}, got '
                             f'{loss!r} (segmentation configs add '
                             "'pseudo_ce_fullres': SegmentationTENT)")
        super().__init__(**kwargs)
        self.loss_type = loss

    def base_loss(self, batch, fwd):
        if self.loss_type == 'pseudo_ce':
            fn = pseudo_label_cross_entropy
        else:
            fn = lambda logits: softmax_entropy(logits).mean()  # noqa: E731
        return mean_over_outputs(lambda _, logits: fn(logits),
                                 fwd.head_outputs)

    def __repr__(self) -> str:
        return super().__repr__()[:-1] + f', loss={self.loss_type!r})'
