from typing import Dict, Sequence, Tuple

import torch
import torch.nn as nn

from mmseg_stag.core import CoTTA
from .full_resolution import full_resolution_cross_entropy, whole_image_logits
from ..task_adapter import SegmentationAdapter
from .registry import SEGMENTATION_METHODS


@SEGMENTATION_METHODS.register_module(name='cotta')
class SegmentationCoTTA(CoTTA):
    """CoTTA per pixel: a multi-view teacher label at full size.

    Follows CoTTA's ACDC mmseg/apis/test.py (single_gpu_cotta).
    """

    supported_prediction_kinds = ('per_pixel', )
    prediction_is_labels = True

    def configure(self, model, adapter):
        if not isinstance(adapter, SegmentationAdapter):
            raise ValueError('CoTTA on segmentation needs the segmentation '
                             'task (views at the original image size)')
        super().configure(model, adapter)

    @torch.no_grad()
    def teacher_prediction(self, batch, stats):
        """Return the multi-view teacher's labels at the original size."""
        if not batch.views:
            raise ValueError(
                'CoTTA on segmentation averages its teacher over the views of '
                'a multi-view pipeline (ScaleFlipViews, see configs/_base_/'
                'datasets/acdc_continual_views.py); this batch has one view')
        labels, view_stats = teacher_labels(
            self.adapter, self.teacher, self.source_model, batch.views,
            batch.main_view, self.ap)
        stats.update(view_stats)
        return labels

    def loss_to_teacher(self, student, teacher):
        logits = whole_image_logits(student, 'CoTTA on segmentation')
        return full_resolution_cross_entropy(logits, teacher)


@torch.no_grad()
def view_probabilities(adapter, model: nn.Module, view) -> torch.Tensor:
    """Return a view's softmax at the original size, flip undone."""
    logits = adapter.forward(model, view).logits
    return adapter.logits_at_original_size(view, logits).softmax(dim=1)


@torch.no_grad()
def teacher_labels(adapter, teacher: nn.Module, source_model: nn.Module,
                   views: Sequence, main_view: int,
                   threshold: float) -> Tuple[torch.Tensor, Dict[str, float]]:
    """Return the label map CoTTA trains on and evaluates, and stats.

    Args:
        adapter (SegmentationAdapter): Runs and resizes the views.
        teacher (nn.Module): The EMA teacher.
        source_model (nn.Module): CoTTA's anchor (source) model.
        views (list[SegmentationBatch]): The batch's views.
        main_view (int): The unflipped view at scale 1.
        threshold (float): CoTTA's ``ap``.
    """
    total = None
    for idx, view in enumerate(views):
        probs = view_probabilities(adapter, teacher, view)
        if idx == main_view:
            single = probs.argmax(dim=1)
        total = probs if total is None else total + probs
    multi = (total / len(views)).argmax(dim=1)
    # CoTTA's anchor model predicts every view but uses only the main one
    confidence = view_probabilities(adapter, source_model,
                                    views[main_view]).max(dim=1)[0]
    confident = confidence > threshold
    labels = torch.where(confident, single, multi)
    return labels, dict(confident_pixels=confident.float().mean(),
                        num_views=float(len(views)))
