from mmseg_stag.core import TENT
from .full_resolution import full_resolution_cross_entropy, whole_image_logits
from .registry import SEGMENTATION_METHODS


@SEGMENTATION_METHODS.register_module(name='tent')
class SegmentationTENT(TENT):
    """TENT with ``loss='pseudo_ce_fullres'``, CoTTA's ACDC loss.

    Follows CoTTA's ACDC mmseg/apis/test.py (single_gpu_tent).

    Args:
        loss (str): Adds ``'pseudo_ce_fullres'``. Default: ``'entropy'``.
        align_corners (bool): Of the resize to full size. Default: False.
        **kwargs: See :class:`~mmseg_stag.core.TENT`.
    """

    LOSSES = TENT.LOSSES + ('pseudo_ce_fullres', )

    def __init__(self, loss: str = 'entropy', align_corners: bool = False,
                 **kwargs):
        super().__init__(loss=loss, **kwargs)
        self.align_corners = bool(align_corners)
        if loss == 'pseudo_ce_fullres':
            self.supported_prediction_kinds = ('per_pixel', )

    def base_loss(self, ctx):
        if self.loss_type != 'pseudo_ce_fullres':
            return super().base_loss(ctx)
        if getattr(ctx, 'labels_at_original_size', None) is None:
            raise ValueError("tent loss='pseudo_ce_fullres' needs the "
                             'segmentation loop (labels at the original '
                             'image size)')
        logits = whole_image_logits(ctx, "tent loss='pseudo_ce_fullres'")
        labels = ctx.labels_at_original_size(ctx.prediction)
        return full_resolution_cross_entropy(logits, labels,
                                             self.align_corners)
