"""The base losses the methods share (pure PyTorch; class axis at dim 1)."""
from typing import Callable, Tuple

import torch
import torch.nn.functional as F

from .probe import HeadOutputs


def softmax_entropy(logits: torch.Tensor) -> torch.Tensor:
    """Shannon entropy of ``softmax(logits)`` along dim 1 (eq:ent)."""
    log_p = logits.log_softmax(dim=1)
    return -(log_p.exp() * log_p).sum(dim=1)


def pseudo_label_cross_entropy(logits: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy to the model's own argmax (CoTTA's ACDC TENT)."""
    return F.cross_entropy(logits, logits.detach().argmax(1))


def cross_entropy_to_teacher(student_logits: torch.Tensor,
                             teacher_logits: torch.Tensor) -> torch.Tensor:
    """Per-sample CE, teacher's softmax as target (CoTTA's CIFAR loss)."""
    return -(teacher_logits.softmax(1) *
             student_logits.log_softmax(1)).sum(1)


def symmetric_cross_entropy(student_logits: torch.Tensor,
                            teacher_logits: torch.Tensor) -> torch.Tensor:
    """Per-sample ``0.5 CE(teacher, student) + 0.5 CE(student, teacher)``
    (CoTTA's ImageNet)."""
    # qinenergy/cotta imagenet/cotta.py: softmax_entropy(x, x_ema)
    return 0.5 * cross_entropy_to_teacher(student_logits, teacher_logits) + \
        0.5 * cross_entropy_to_teacher(teacher_logits, student_logits)


def mean_over_outputs(fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
                      head_outputs: HeadOutputs) -> torch.Tensor:
    """Mean of ``fn(features, logits)`` over pairs, weighted by their size."""
    if len(head_outputs) == 1:  # no weights: two fewer ops a step
        return fn(*head_outputs[0])
    sizes = [logits[:, 0].numel() for _, logits in head_outputs]
    total = float(sum(sizes))
    return sum(fn(feats, logits) * (size / total)
               for (feats, logits), size in zip(head_outputs, sizes))


def flatten_outputs(head_outputs: HeadOutputs
                    ) -> Tuple[torch.Tensor, torch.Tensor]:
    """Concatenate the pairs of a forward pass, one row per sample or
    pixel: ``features [M, D]`` and ``logits [M, C]``."""
    if len(head_outputs) == 1 and head_outputs[0][1].dim() == 2:
        return head_outputs[0]
    feats, logits = zip(*[(pixels_as_rows(f), pixels_as_rows(z))
                          for f, z in head_outputs])
    return torch.cat(feats), torch.cat(logits)


def flatten_logits(head_outputs: HeadOutputs) -> torch.Tensor:
    """The logits of :func:`flatten_outputs` alone (no ``D``-sized copy)."""
    return torch.cat([pixels_as_rows(z) for _, z in head_outputs]) \
        if len(head_outputs) > 1 or head_outputs[0][1].dim() == 4 \
        else head_outputs[0][1]


def pixels_as_rows(x: torch.Tensor) -> torch.Tensor:
    """``[N, D, h, w] -> [N*h*w, D]``, pixels row by row; ``[N, D]`` as is."""
    if x.dim() == 2:
        return x
    return x.permute(0, 2, 3, 1).reshape(-1, x.shape[1])
