"""The base losses the methods share (pure PyTorch; class axis at dim 1)."""
from typing import Callable, Sequence, Tuple, Union

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
    """Per-sample mean of both cross-entropies (CoTTA's ImageNet).

    Returns:
        Tensor: ``0.5 CE(teacher, student) + 0.5 CE(student, teacher)``.
    """
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


#: the prediction kind of logits by their number of dimensions
PREDICTION_KIND_OF_DIM = {2: 'per_sample', 4: 'per_pixel'}


def flatten_outputs(head_outputs: HeadOutputs, method: str,
                    supported: Union[str, Sequence[str]] = ('per_sample',
                                                            'per_pixel')
                    ) -> Tuple[torch.Tensor, torch.Tensor]:
    """Concatenate the pairs of a forward pass, one row per sample or pixel.

    Args:
        head_outputs (Sequence[tuple]): ``(features, logits)`` pairs.
        method (str): The method's name, for the error messages.
        supported (str | Sequence[str]): Prediction kinds the caller
            accepts.

    Returns:
        tuple[Tensor, Tensor]: ``features [M, D]`` and ``logits [M, C]``.

    Raises:
        ValueError: On an unsupported or mixed prediction kind, or no pair.
    """
    check_prediction_kinds(head_outputs, method, supported)
    if PREDICTION_KIND_OF_DIM[head_outputs[0][1].dim()] == 'per_sample' and \
            len(head_outputs) == 1:
        return head_outputs[0]
    feats, logits = zip(*[(pixels_as_rows(f), pixels_as_rows(z))
                          for f, z in head_outputs])
    return torch.cat(feats), torch.cat(logits)


def flatten_logits(head_outputs: HeadOutputs, method: str,
                   supported: Union[str, Sequence[str]] = ('per_sample',
                                                           'per_pixel')
                   ) -> torch.Tensor:
    """The logits of :func:`flatten_outputs` alone (no ``D``-sized copy).

    Raises:
        ValueError: As :func:`flatten_outputs`.
    """
    check_prediction_kinds(head_outputs, method, supported)
    return torch.cat([pixels_as_rows(z) for _, z in head_outputs]) \
        if len(head_outputs) > 1 or head_outputs[0][1].dim() == 4 \
        else head_outputs[0][1]


def check_prediction_kinds(head_outputs: HeadOutputs, method: str,
                           supported: Union[str, Sequence[str]]) -> None:
    """Raise ``ValueError`` unless the pairs are of one supported kind."""
    supported = (supported, ) if isinstance(supported, str) else \
        tuple(supported)
    kinds = set()
    for _, logits in head_outputs:
        kind = PREDICTION_KIND_OF_DIM.get(logits.dim())
        if kind not in supported:
            raise ValueError(_unsupported(method, supported, logits))
        kinds.add(kind)
    if not kinds:
        raise ValueError(f'{method}: no head outputs')
    if len(kinds) > 1:
        raise ValueError(f'{method}: a forward pass gave both per-sample and '
                         'per-pixel logits')


def pixels_as_rows(x: torch.Tensor) -> torch.Tensor:
    """``[N, D, h, w] -> [N*h*w, D]``, pixels row by row; ``[N, D]`` as is."""
    if x.dim() == 2:
        return x
    return x.permute(0, 2, 3, 1).reshape(-1, x.shape[1])


_DESCRIPTION = {'per_sample': 'per-sample classification outputs (logits '
                             '[N, C])',
                'per_pixel': 'per-pixel segmentation outputs (logits [N, C, '
                             'h, w])'}


def _unsupported(method: str, supported: Tuple[str, ...],
                 logits: torch.Tensor) -> str:
    """The error message for logits of an unsupported kind."""
    shape = tuple(logits.shape)
    if len(supported) == 1:
        return (f'{method} was configured for {_DESCRIPTION[supported[0]]}; '
                f'got logits of shape {shape}')
    return (f'{method} needs logits [N, C] (per sample) or [N, C, h, w] (per '
            f'pixel); got logits of shape {shape}')


def per_sample_logits(head_outputs: HeadOutputs,
                      method: str) -> Tuple[torch.Tensor, torch.Tensor]:
    """``(features [N, D], logits [N, C])`` of a per-sample forward pass.

    Raises:
        ValueError: Naming ``method`` for per-pixel outputs.
    """
    for _, logits in head_outputs:
        if logits.dim() != 2:
            raise ValueError(
                f'{method} supports per-sample classification outputs only '
                f'(logits [N, C]); got logits of shape '
                f'{tuple(logits.shape)} (per-pixel segmentation outputs are '
                'not supported)')
    return flatten_outputs(head_outputs, method, ('per_sample', ))
