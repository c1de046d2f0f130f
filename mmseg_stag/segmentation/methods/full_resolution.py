"""The segmentation batch context, its views and the full-size loss."""
from dataclasses import dataclass
from typing import Any, Callable, List, Optional

import torch
import torch.nn.functional as F

from mmseg_stag.core import BatchContext
from mmseg_stag.core.probe import Forward


@dataclass
class View:
    """One test-time view (a scale and flip) of a segmentation batch.

    Args:
        inputs (Any): The view's preprocessed images.
        forward (Forward): ``forward(model, inputs)`` for this view.
        to_original_size (Callable): Logits to ``[N, C, H0, W0]``, unflipped.
    """
    inputs: Any
    forward: Forward
    to_original_size: Callable[[torch.Tensor], torch.Tensor]


@dataclass
class SegmentationBatchContext(BatchContext):
    """A segmentation batch: the core context plus the original images.

    Args:
        labels_at_original_size (Callable, optional): Logits to labels.
        views (list[View], optional): Every view; None: one view.
        main_view (int): Index of ``inputs`` in ``views``. Default: 0.
    """
    labels_at_original_size: Optional[Callable[[torch.Tensor],
                                               torch.Tensor]] = None
    views: Optional[List[View]] = None
    main_view: int = 0


def full_resolution_cross_entropy(logits: torch.Tensor,
                                  labels: torch.Tensor,
                                  align_corners: bool = False) -> torch.Tensor:
    """Return the cross-entropy of logits resized straight to ``labels``."""
    logits = F.interpolate(logits, size=labels.shape[-2:], mode='bilinear',
                           align_corners=align_corners)
    return F.cross_entropy(logits, labels.long())


def whole_image_logits(ctx: BatchContext, what: str) -> torch.Tensor:
    """Return the logits of a whole-image forward.

    Raises:
        ValueError: If the forward made more than one classifier call.
    """
    if len(ctx.head_outputs) != 1:
        raise ValueError(
            f'{what} trains on the whole image, as CoTTA\'s ACDC code does: '
            "use whole inference (model.test_cfg.mode='whole'), got "
            f'{len(ctx.head_outputs)} classifier calls per image')
    return ctx.head_outputs[0][1]
