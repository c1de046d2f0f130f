from ..losses import (full_resolution_cross_entropy, mean_over_outputs,
                      pseudo_label_cross_entropy, softmax_entropy)
from ..registry import METHODS
from .base import BaseMethod


@METHODS.register_module(name='tent')
class TENT(BaseMethod):
    """TENT (Wang et al., ICLR 2021): minimise the prediction entropy.

    The normalisation layers' affine parameters are adapted; the model stays
    in evaluation mode (BatchNorm uses its running statistics), as in CoTTA's
    ACDC code.

    Args:
        loss (str): ``'entropy'`` (the paper's TENT, eq:ent, averaged over
            samples/pixels), ``'pseudo_ce'`` (cross-entropy to the model's
            own argmax at the head's resolution) or ``'pseudo_ce_fullres'``
            (segmentation: CoTTA's ACDC TENT, ``single_gpu_tent``: the label
            is the argmax of the prediction at the original image size, the
            head's logits are resized bilinearly straight to it, mean over
            all pixels).
        align_corners (bool): of that resize (the decode head's).
            Default: False.
        **kwargs: see :class:`BaseMethod`.
    """

    LOSSES = ('entropy', 'pseudo_ce', 'pseudo_ce_fullres')

    def __init__(self, loss: str = 'entropy', align_corners: bool = False,
                 **kwargs):
        if loss not in self.LOSSES:
            raise ValueError(f'tent loss must be one of {self.LOSSES}, got '
                             f'{loss!r}')
        super().__init__(**kwargs)
        self.loss_type = loss
        self.align_corners = bool(align_corners)
        if loss == 'pseudo_ce_fullres':
            self.supported_outputs = ('per_pixel', )

    def base_loss(self, ctx):
        if self.loss_type == 'pseudo_ce_fullres':
            return self.full_resolution_loss(ctx)
        if self.loss_type == 'pseudo_ce':
            fn = pseudo_label_cross_entropy
        else:
            fn = lambda logits: softmax_entropy(logits).mean()  # noqa: E731
        return mean_over_outputs(lambda _, logits: fn(logits),
                                 ctx.head_outputs)

    def full_resolution_loss(self, ctx):
        if ctx.labels_at_original_size is None:
            raise ValueError("tent loss='pseudo_ce_fullres' needs the "
                             'segmentation loop (labels at the original '
                             'image size)')
        if len(ctx.head_outputs) != 1:
            raise ValueError(
                "tent loss='pseudo_ce_fullres' trains on the whole image, as "
                'CoTTA\'s code does: use whole inference (model.test_cfg.'
                f"mode='whole'), got {len(ctx.head_outputs)} classifier "
                'calls per image')
        labels = ctx.labels_at_original_size(ctx.prediction)
        _, logits = ctx.head_outputs[0]
        return full_resolution_cross_entropy(logits, labels,
                                             self.align_corners)

    def __repr__(self) -> str:
        return super().__repr__()[:-1] + f', loss={self.loss_type!r})'
