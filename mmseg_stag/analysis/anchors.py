"""Validation of the classifier weights as structural anchors (Figure
structural_anchor): each weight vector ``w_k`` fed to the classifier as a
virtual input."""
from typing import Dict, List, Optional

import torch

from mmseg_stag.core.stag import check_classifier, inter_class_logits


@torch.no_grad()
def assignment_matrix(weight: torch.Tensor,
                      bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``P [C, C]``, ``P_kj = softmax_j(Z_k)`` with ``Z_kj = w_j . w_k +
    b_j`` (eq:inter-class_matrix): row ``k`` is the class distribution the
    classifier assigns to its own weight vector ``w_k``."""
    weight = check_classifier(weight, bias).double()
    bias = None if bias is None else bias.detach().double()
    return inter_class_logits(weight, bias).softmax(dim=1)


@torch.no_grad()
def anchor_validation(weight: torch.Tensor,
                      bias: Optional[torch.Tensor] = None) -> Dict[str, float]:
    """The figure's three numbers for one classifier.

    Returns:
        ``self_entropy``: ``H = mean_k H_k``, ``H_k = -sum_j P_kj ln P_kj``
        (eq:self_entropy, nats); ``mdp``: the mean diagonal probability
        ``psi = mean_k P_kk``; ``structural_accuracy``: the share (%) of
        classes whose own weight vector is assigned to them
        (``argmax_j P_kj = k``); ``num_classes``.
    """
    p = assignment_matrix(weight, bias)
    log_p = p.clamp_min(torch.finfo(p.dtype).tiny).log()
    classes = torch.arange(p.shape[0])
    return dict(
        self_entropy=float(-(p * log_p).sum(1).mean()),
        mdp=float(p.diagonal().mean()),
        structural_accuracy=100.0 * float(
            (p.argmax(1) == classes).double().mean()),
        num_classes=int(p.shape[0]))


def heatmap_classes(num_classes: int, count: int = 20) -> List[int]:
    """``count`` classes evenly spread over ``0 .. num_classes - 1`` (the
    figure shows 20); a ValueError when the classifier has fewer."""
    if count < 2:
        raise ValueError(f'the heatmap needs at least 2 classes, got {count}')
    if num_classes < count:
        raise ValueError(f'the heatmap shows {count} classes but the '
                         f'classifier has {num_classes}: pass '
                         f'--heatmap-classes {num_classes} (or fewer)')
    step = (num_classes - 1) / (count - 1)
    return [round(i * step) for i in range(count)]
