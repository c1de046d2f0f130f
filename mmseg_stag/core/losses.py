"""The base losses the methods share (pure PyTorch; class axis at dim 1)."""
from typing import Callable, Sequence, Tuple, Union

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


#: the output kind of logits by their number of dimensions
OUTPUT_KIND_OF_DIM = {2: 'per_sample', 4: 'per_pixel'}


def flatten_outputs(head_outputs: HeadOutputs, method: str,
                    supported: Union[str, Sequence[str]] = ('per_sample',
                                                            'per_pixel')
                    ) -> Tuple[torch.Tensor, torch.Tensor]:
    """``(features [M, D], logits [M, C])``: the samples of a forward pass,
    every pixel of per-pixel outputs a sample.

    Per-sample pairs ``(features [N, D], logits [N, C])`` are returned as
    they are (one pair) or concatenated (several pairs). Per-pixel pairs
    ``(features [N, D, h, w], logits [N, C, h, w])`` (the classifier's
    resolution) become ``[N*h*w, D]`` and ``[N*h*w, C]``: pixel ``(n, i,
    j)`` of a pair is row ``n*h*w + i*w + j`` (image by image, each image's
    pixels row by row: ``permute(0, 2, 3, 1).reshape(-1, C)``); several
    pairs (sliding-window crops, in the order of the classifier's calls)
    are concatenated in that order, so a pixel covered by two crops is two
    samples.

    Args:
        head_outputs: ``[(features, logits), ...]`` of one forward pass.
        method: the method's name, for the error messages.
        supported: the output kinds (``'per_sample'``, ``'per_pixel'``) the
            caller accepts; a ValueError naming ``method`` for any other.
    """
    supported = (supported, ) if isinstance(supported, str) else \
        tuple(supported)
    kinds = set()
    for _, logits in head_outputs:
        kind = OUTPUT_KIND_OF_DIM.get(logits.dim())
        if kind not in supported:
            raise ValueError(_unsupported(method, supported, logits))
        kinds.add(kind)
    if not kinds:
        raise ValueError(f'{method}: no head outputs')
    if len(kinds) > 1:
        raise ValueError(f'{method}: a forward pass gave both per-sample and '
                         'per-pixel logits')
    if kinds == {'per_sample'} and len(head_outputs) == 1:
        return head_outputs[0]
    feats, logits = zip(*[(_pixels_as_rows(f), _pixels_as_rows(z))
                          for f, z in head_outputs])
    return torch.cat(feats), torch.cat(logits)


def _pixels_as_rows(x: torch.Tensor) -> torch.Tensor:
    """``[N, D, h, w] -> [N*h*w, D]`` (row-major pixels of each image);
    ``[N, D]`` unchanged."""
    if x.dim() == 2:
        return x
    return x.permute(0, 2, 3, 1).reshape(-1, x.shape[1])


_DESCRIPTION = {'per_sample': 'per-sample classification outputs (logits '
                             '[N, C])',
                'per_pixel': 'per-pixel segmentation outputs (logits [N, C, '
                             'h, w])'}


def _unsupported(method: str, supported: Tuple[str, ...],
                 logits: torch.Tensor) -> str:
    shape = tuple(logits.shape)
    if len(supported) == 1:
        return (f'{method} was configured for {_DESCRIPTION[supported[0]]}; '
                f'got logits of shape {shape}')
    return (f'{method} needs logits [N, C] (per sample) or [N, C, h, w] (per '
            f'pixel); got logits of shape {shape}')


def per_sample_logits(head_outputs: HeadOutputs,
                      method: str) -> Tuple[torch.Tensor, torch.Tensor]:
    """``(features [N, D], logits [N, C])`` of a per-sample forward pass,
    concatenated over the pairs; raises a ValueError naming ``method`` for
    per-pixel outputs (:func:`flatten_outputs` for per-sample outputs
    only)."""
    for _, logits in head_outputs:
        if logits.dim() != 2:
            raise ValueError(
                f'{method} supports per-sample classification outputs only '
                f'(logits [N, C]); got logits of shape '
                f'{tuple(logits.shape)} (per-pixel segmentation outputs are '
                'not supported)')
    return flatten_outputs(head_outputs, method, ('per_sample', ))
