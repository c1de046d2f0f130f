"""What a per-pixel method sees at the images' original size: the
segmentation batch context, its views and the full-resolution loss."""
from dataclasses import dataclass
from typing import Any, Callable, List, Optional

import torch
import torch.nn.functional as F

from mmseg_stag.core import BatchContext
from mmseg_stag.core.probe import Forward


@dataclass
class View:
    """One test-time view of a segmentation batch (a scale x flip of
    ``ScaleFlipViews``/``TestTimeAug``), as CoTTA's teacher reads them.

    Args:
        inputs: the view's preprocessed images.
        forward: ``forward(model, inputs)`` with the view's metainfo.
        to_original_size: ``f(seg_logits) -> logits [N, C, H0, W0]``, flip
            undone (MMSeg's ``postprocess_result``).
    """
    inputs: Any
    forward: Forward
    to_original_size: Callable[[torch.Tensor], torch.Tensor]


@dataclass
class SegmentationBatchContext(BatchContext):
    """A segmentation batch: :class:`~mmseg_stag.core.BatchContext` plus
    what MMSeg knows of the original images.

    Args:
        labels_at_original_size: ``f(seg_logits) -> labels [N, H0, W0]``,
            the argmax of a prediction at the original size (what the
            metric scores).
        views: every :class:`View` of a multi-view pipeline's batch
            (``views[main_view]`` is ``inputs``); ``None``: one view.
        main_view: see ``views``.
    """
    labels_at_original_size: Optional[Callable[[torch.Tensor],
                                               torch.Tensor]] = None
    views: Optional[List[View]] = None
    main_view: int = 0


def full_resolution_cross_entropy(logits: torch.Tensor,
                                  labels: torch.Tensor,
                                  align_corners: bool = False) -> torch.Tensor:
    """Mean cross-entropy of ``logits [N, C, h, w]`` resized bilinearly
    straight to ``labels [N, H, W]``, over all pixels (CoTTA's ACDC code:
    ``single_gpu_tent`` -> MMSeg 0.x ``BaseDecodeHead.losses``)."""
    logits = F.interpolate(logits, size=labels.shape[-2:], mode='bilinear',
                           align_corners=align_corners)
    return F.cross_entropy(logits, labels.long())


def whole_image_logits(ctx: BatchContext, what: str) -> torch.Tensor:
    """The one classifier call's logits of a whole-image forward."""
    if len(ctx.head_outputs) != 1:
        raise ValueError(
            f'{what} trains on the whole image, as CoTTA\'s ACDC code does: '
            "use whole inference (model.test_cfg.mode='whole'), got "
            f'{len(ctx.head_outputs)} classifier calls per image')
    return ctx.head_outputs[0][1]
