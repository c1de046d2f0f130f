"""CoTTA's per-pixel teacher label for segmentation (CoTTA's ACDC code,
``mmseg/apis/test.py`` ``single_gpu_cotta``; ``aug_test`` and
``inference`` of its ``EncoderDecoder``)."""
from typing import Dict, Sequence, Tuple

import torch
import torch.nn as nn

from .base import View


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
