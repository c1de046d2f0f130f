from ..losses import (mean_over_outputs, pseudo_label_cross_entropy,
                      softmax_entropy)
from ..registry import METHODS
from .base import BaseMethod


@METHODS.register_module(name='tent')
class TENT(BaseMethod):
    """TENT (Wang et al., ICLR 2021): minimise the prediction entropy.

    Follows DequanWang/tent's tent.py (forward_and_adapt), in eval mode;
    ``loss='pseudo_ce_fullres'`` follows CoTTA's ACDC mmseg/apis/test.py
    (single_gpu_tent). ``loss`` and ``align_corners``: docs/methods.md
    (TENT); ``**kwargs``: see :class:`BaseMethod`.

    Raises:
        ValueError: If ``loss`` is unknown.
    """

    LOSSES = ('entropy', 'pseudo_ce', 'pseudo_ce_fullres')
    graph_capturable = True
    repr_fields = ('loss_type', )

    def __init__(self, loss: str = 'entropy', align_corners: bool = False,
                 **kwargs):
        if loss not in self.LOSSES:
            raise ValueError(f'tent loss must be one of {self.LOSSES}, got '
                             f'{loss!r}')
        if align_corners and loss != 'pseudo_ce_fullres':
            # only the full-size loss resizes: elsewhere it would do nothing
            raise ValueError(f"tent align_corners=True resizes the logits of "
                             f"loss='pseudo_ce_fullres' only; loss={loss!r} "
                             'resizes nothing: remove it')
        super().__init__(**kwargs)
        self.loss_type = loss
        self.align_corners = bool(align_corners)

    @property
    def needs_original_size(self) -> bool:
        return self.loss_type == 'pseudo_ce_fullres'

    def base_loss(self, batch, fwd):
        if self.loss_type == 'pseudo_ce_fullres':
            # to the labels the batch is scored on, at the original size
            return self.task_adapter.cross_entropy_at_original_size(
                fwd, align_corners=self.align_corners, batch=batch)
        if self.loss_type == 'pseudo_ce':
            fn = pseudo_label_cross_entropy
        else:
            fn = lambda logits: softmax_entropy(logits).mean()  # noqa: E731
        return mean_over_outputs(lambda _, logits: fn(logits),
                                 fwd.head_outputs)
