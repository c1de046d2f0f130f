from typing import Dict, Sequence, Tuple

import torch
import torch.nn as nn

from mmseg_stag.core import CoTTA
from .full_resolution import (View, full_resolution_cross_entropy,
                              whole_image_logits)
from .registry import SEGMENTATION_METHODS


@SEGMENTATION_METHODS.register_module(name='cotta')
class SegmentationCoTTA(CoTTA):
    """CoTTA per pixel: a multi-view teacher label at full size.

    Follows CoTTA's ACDC mmseg/apis/test.py (single_gpu_cotta).
    """

    supported_prediction_kinds = ('per_sample', 'per_pixel')

    def base_loss(self, ctx):
        if not (ctx.head_outputs and ctx.head_outputs[0][1].dim() == 4):
            return super().base_loss(ctx)
        if not getattr(ctx, 'views', None):
            raise ValueError(
                'CoTTA on segmentation averages its teacher over the views of '
                'a multi-view pipeline (ScaleFlipViews, see configs/_base_/'
                'datasets/acdc_continual_views.py); this batch has one view')
        logits = whole_image_logits(ctx, 'CoTTA on segmentation')
        labels, stats = teacher_labels(self.teacher, self.source_model,
                                       ctx.views, ctx.main_view, self.ap)
        ctx.prediction = labels
        ctx.stats.update(stats)
        return full_resolution_cross_entropy(logits, labels)


@torch.no_grad()
def view_probabilities(model: nn.Module, view: View) -> torch.Tensor:
    """Return a view's softmax at the original size, flip undone."""
    logits, _ = view.forward(model, view.inputs)
    return view.to_original_size(logits).softmax(dim=1)


@torch.no_grad()
def teacher_labels(teacher: nn.Module, source_model: nn.Module,
                   views: Sequence[View], main_view: int,
                   threshold: float) -> Tuple[torch.Tensor, Dict[str, float]]:
    """Return the label map CoTTA trains on and evaluates, and stats."""
    total = None
    for idx, view in enumerate(views):
        probs = view_probabilities(teacher, view)
        if idx == main_view:
            single = probs.argmax(dim=1)
        total = probs if total is None else total + probs
    multi = (total / len(views)).argmax(dim=1)
    # CoTTA's anchor model predicts every view but uses only the main one
    confidence = view_probabilities(source_model,
                                    views[main_view]).max(dim=1)[0]
    confident = confidence > threshold
    labels = torch.where(confident, single, multi)
    return labels, dict(confident_pixels=confident.float().mean(),
                        num_views=float(len(views)))
