from mmseg_stag.core import TENT
from .full_resolution import full_resolution_cross_entropy, whole_image_logits
from ..task_adapter import SegmentationAdapter
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

    @property
    def supported_prediction_kinds(self):
        if self.loss_type == 'pseudo_ce_fullres':
            return ('per_pixel', )
        return TENT.supported_prediction_kinds

    def configure(self, model, adapter):
        if self.loss_type == 'pseudo_ce_fullres' and not isinstance(
                adapter, SegmentationAdapter):
            raise ValueError("tent loss='pseudo_ce_fullres' needs the "
                             'segmentation task (labels at the original '
                             'image size)')
        super().configure(model, adapter)

    def base_loss(self, batch, fwd):
        if self.loss_type != 'pseudo_ce_fullres':
            return super().base_loss(batch, fwd)
        logits = whole_image_logits(fwd, "tent loss='pseudo_ce_fullres'")
        # the labels the batch is scored on, at the original size
        labels = self.adapter.labels_at_original_size(batch, fwd)
        return full_resolution_cross_entropy(logits, labels,
                                             self.align_corners)
