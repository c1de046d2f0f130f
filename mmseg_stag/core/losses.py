"""The base losses the methods share (pure PyTorch; class axis at dim 1)."""
from typing import Callable, Sequence, Tuple

import torch
import torch.nn.functional as F

HeadOutputs = Sequence[Tuple[torch.Tensor, torch.Tensor]]


def softmax_entropy(logits: torch.Tensor) -> torch.Tensor:
    """Shannon entropy of ``softmax(logits)`` along dim 1 (eq:ent)."""
    log_p = logits.log_softmax(dim=1)
    return -(log_p.exp() * log_p).sum(dim=1)


def pseudo_label_cross_entropy(logits: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy to the model's own argmax (CoTTA's ACDC TENT)."""
    return F.cross_entropy(logits, logits.detach().argmax(1))


def full_resolution_cross_entropy(logits: torch.Tensor,
                                  labels: torch.Tensor,
                                  align_corners: bool = False) -> torch.Tensor:
    """Mean cross-entropy of per-pixel ``logits [N, C, h, w]`` resized
    bilinearly straight to the size of ``labels [N, H, W]``, over all pixels.

    CoTTA's ACDC code (``single_gpu_tent`` -> MMSeg 0.x
    ``BaseDecodeHead.losses``): the head's logits are resized to the label
    map, here the prediction at the original image size.
    """
    logits = F.interpolate(logits, size=labels.shape[-2:], mode='bilinear',
                           align_corners=align_corners)
    return F.cross_entropy(logits, labels.long())


def cross_entropy_to_teacher(student_logits: torch.Tensor,
                             teacher_logits: torch.Tensor) -> torch.Tensor:
    """Per-sample ``-sum_c softmax(teacher)_c log_softmax(student)_c``
    (CoTTA's CIFAR ``softmax_entropy(x, x_ema)``)."""
    return -(teacher_logits.softmax(1) *
             student_logits.log_softmax(1)).sum(1)


def symmetric_cross_entropy(student_logits: torch.Tensor,
                            teacher_logits: torch.Tensor) -> torch.Tensor:
    """Per-sample mean of the cross-entropies both ways between student and
    teacher (CoTTA's ImageNet ``softmax_entropy(x, x_ema)``).

    Args:
        student_logits (Tensor): ``x``, class axis at dim 1.
        teacher_logits (Tensor): ``x_ema``, same shape (detach it to train
            the student only).

    Returns:
        Tensor: ``0.5 CE(teacher -> student) + 0.5 CE(student -> teacher)``,
        the class axis summed out.
    """
    # qinenergy/cotta imagenet/cotta.py: softmax_entropy(x, x_ema)
    return 0.5 * cross_entropy_to_teacher(student_logits, teacher_logits) + \
        0.5 * cross_entropy_to_teacher(teacher_logits, student_logits)


def mean_over_outputs(fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
                      head_outputs: HeadOutputs) -> torch.Tensor:
    """Mean of a per-pair mean loss over all samples/pixels of all pairs.

    ``fn(features, logits)`` returns the mean over one pair; pairs (e.g.
    sliding-window crops) are weighted by their number of samples/pixels.
    """
    sizes = [logits[:, 0].numel() for _, logits in head_outputs]
    total = float(sum(sizes))
    return sum(fn(feats, logits) * (size / total)
               for (feats, logits), size in zip(head_outputs, sizes))


def per_sample_logits(head_outputs: HeadOutputs,
                      method: str) -> Tuple[torch.Tensor, torch.Tensor]:
    """``(features [N, D], logits [N, C])`` of a per-sample forward pass,
    concatenated over the pairs; raises a ValueError naming ``method`` for
    per-pixel outputs."""
    for _, logits in head_outputs:
        if logits.dim() != 2:
            raise ValueError(
                f'{method} supports per-sample classification outputs only '
                f'(logits [N, C]); got logits of shape '
                f'{tuple(logits.shape)} (per-pixel segmentation outputs are '
                'not supported)')
    if len(head_outputs) == 1:
        return head_outputs[0]
    return (torch.cat([f for f, _ in head_outputs]),
            torch.cat([z for _, z in head_outputs]))
