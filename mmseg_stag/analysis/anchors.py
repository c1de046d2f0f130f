"""Classifier weights as structural anchors (Figure structural_anchor)."""
from typing import Dict, List, Optional

import torch

from mmseg_stag.core.stag import check_classifier, inter_class_logits


@torch.no_grad()
def assignment_matrix(weight: torch.Tensor,
                      bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Return ``P_kj = softmax_j(w_j . w_k + b_j)`` (eq:inter-class_matrix)."""
    weight = check_classifier(weight, bias).double()
    bias = None if bias is None else bias.detach().double()
    return inter_class_logits(weight, bias).softmax(dim=1)


@torch.no_grad()
def anchor_validation(weight: torch.Tensor,
                      bias: Optional[torch.Tensor] = None) -> Dict[str, float]:
    """The figure's numbers for one classifier: ``self_entropy``
    (eq:self_entropy, nats), ``mdp`` (mean of ``P_kk``),
    ``structural_accuracy`` (%) and ``num_classes``."""
    p = assignment_matrix(weight, bias)
    log_p = p.clamp_min(torch.finfo(p.dtype).tiny).log()
    # on the matrix's device: a CUDA classifier is compared on the GPU
    classes = torch.arange(p.shape[0], device=p.device)
    return dict(
        self_entropy=float(-(p * log_p).sum(1).mean()),
        mdp=float(p.diagonal().mean()),
        structural_accuracy=100.0 * float(
            (p.argmax(1) == classes).double().mean()),
        num_classes=int(p.shape[0]))


def heatmap_classes(num_classes: int, count: int = 20) -> List[int]:
    """``count`` (at least 2) classes evenly spread over ``0 ..
    num_classes - 1``."""
    if count < 2:
        raise ValueError(f'the heatmap needs at least 2 classes, got {count}')
    if num_classes < count:
        raise ValueError(f'the heatmap shows {count} classes but the '
                         f'classifier has {num_classes}: pass '
                         f'--heatmap-classes {num_classes} (or fewer)')
    step = (num_classes - 1) / (count - 1)
    return [round(i * step) for i in range(count)]
