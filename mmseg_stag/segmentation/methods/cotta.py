from typing import Dict, Sequence, Tuple

import torch
import torch.nn as nn

from mmseg_stag.core import CoTTA
from .full_resolution import (View, full_resolution_cross_entropy,
                              whole_image_logits)
from .registry import SEGMENTATION_METHODS


@SEGMENTATION_METHODS.register_module(name='cotta')
class SegmentationCoTTA(CoTTA):
    """CoTTA per pixel, as the authors' ACDC code (``mmseg/apis/test.py``
    ``single_gpu_cotta``): the teacher predicts every view of a multi-view
    pipeline (``ctx.views``), its label is :func:`teacher_labels`, the
    student (main view, the one forward) is trained with cross-entropy to
    that label at the original size, and the label is the evaluated
    prediction. The EMA update and the stochastic restore are the core's.

    Args:
        ap (float): the source model's confidence per pixel above which the
            teacher's main-view label is kept (ACDC: 0.69).
        **kwargs: see :class:`~mmseg_stag.core.CoTTA`.
    """

    supported_outputs = ('per_sample', 'per_pixel')

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
    """Softmax of ``model``'s prediction of one view at the original image
    size, flip undone (0.x ``inference`` with ``rescale=True``)."""
    logits, _ = view.forward(model, view.inputs)
    return view.to_original_size(logits).softmax(dim=1)


@torch.no_grad()
def teacher_labels(teacher: nn.Module, source_model: nn.Module,
                   views: Sequence[View], main_view: int,
                   threshold: float) -> Tuple[torch.Tensor, Dict[str, float]]:
    """The label map CoTTA trains on and evaluates, ``[N, H0, W0]``.

    Where the source model's confidence at the main view exceeds
    ``threshold`` (0.69), the teacher's main-view label; elsewhere the
    argmax of the teacher's probabilities averaged over all views.
    """
    total = None
    for idx, view in enumerate(views):
        probs = view_probabilities(teacher, view)
        if idx == main_view:
            single = probs.argmax(dim=1)
        total = probs if total is None else total + probs
    multi = (total / len(views)).argmax(dim=1)
    # the authors' anchor (the source model) predicts every view; only the
    # main one is used
    confidence = view_probabilities(source_model,
                                    views[main_view]).max(dim=1)[0]
    confident = confidence > threshold
    labels = torch.where(confident, single, multi)
    return labels, dict(confident_pixels=confident.float().mean().item(),
                        num_views=float(len(views)))
