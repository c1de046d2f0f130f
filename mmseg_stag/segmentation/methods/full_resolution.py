"""The full-size loss of CoTTA's ACDC code, deterministic on CUDA too."""
from typing import Tuple

import torch
import torch.nn.functional as F

from mmseg_stag.core import ForwardPass


def full_resolution_cross_entropy(logits: torch.Tensor,
                                  labels: torch.Tensor,
                                  align_corners: bool = False) -> torch.Tensor:
    """Return the cross-entropy of logits resized straight to ``labels``.

    In deterministic mode :func:`bilinear_resize` and
    :func:`deterministic_cross_entropy` (``nll_loss2d`` has no
    deterministic CUDA kernel); else ``F.interpolate`` and
    ``F.cross_entropy``.

    Args:
        logits (Tensor): ``[N, C, h, w]`` logits of the head.
        labels (Tensor): ``[N, H, W]`` labels at the original size.
        align_corners (bool): Of the bilinear resize. Default: False.

    Returns:
        Tensor: The mean over all pixels.
    """
    size = tuple(labels.shape[-2:])
    if torch.are_deterministic_algorithms_enabled():
        return deterministic_cross_entropy(
            bilinear_resize(logits, size, align_corners), labels.long())
    logits = F.interpolate(logits, size=size, mode='bilinear',
                           align_corners=align_corners)
    return F.cross_entropy(logits, labels.long())


def deterministic_cross_entropy(logits: torch.Tensor, labels: torch.Tensor,
                                ignore_index: int = -100) -> torch.Tensor:
    """Return ``F.cross_entropy(logits, labels, ignore_index=...)`` (mean).

    Log-softmax and ``gather``, deterministic on CUDA unlike ``nll_loss2d``
    (the same mean, NaN if every pixel is ignored, in another order).

    Args:
        logits (Tensor): ``[N, C, ...]`` logits.
        labels (Tensor): ``[N, ...]`` integer labels.
        ignore_index (int): Label that contributes nothing. Default: -100.

    Returns:
        Tensor: The scalar mean cross-entropy.
    """
    valid = labels != ignore_index
    index = torch.where(valid, labels, torch.zeros_like(labels))
    log_p = logits.log_softmax(dim=1).gather(1, index.unsqueeze(1))
    nll = -log_p.squeeze(1) * valid
    return nll.sum() / valid.sum()


def bilinear_resize(x: torch.Tensor, size: Tuple[int, int],
                    align_corners: bool = False) -> torch.Tensor:
    """Return ``F.interpolate(x, size, mode='bilinear')`` as two matmuls.

    ``R_h @ x @ R_wᵀ`` with :func:`interpolation_matrix`: the backward is
    two matmuls too, deterministic on CUDA, and lighter than the path
    ``F.interpolate`` takes there in deterministic mode (four full-size
    gathers, an index-put backward). Runs in float32 (float64 kept) with
    autocast off, as ``F.interpolate`` does under autocast.

    Args:
        x (Tensor): ``[N, C, h, w]``.
        size (tuple[int, int]): ``(H, W)``.
        align_corners (bool): As ``F.interpolate``'s. Default: False.

    Returns:
        Tensor: ``[N, C, H, W]``.
    """
    (h, w), (out_h, out_w) = x.shape[-2:], size
    with torch.autocast(x.device.type, enabled=False):
        x = x if x.dtype == torch.float64 else x.float()
        rows = interpolation_matrix(h, out_h, align_corners, x)
        cols = interpolation_matrix(w, out_w, align_corners, x)
        # the order of the two products with fewer multiplications
        width_first = h * w * out_w + out_h * h * out_w
        height_first = out_h * h * w + out_h * w * out_w
        if width_first <= height_first:
            return rows @ (x @ cols.T)
        return (rows @ x) @ cols.T


def interpolation_matrix(in_size: int, out_size: int, align_corners: bool,
                         like: torch.Tensor) -> torch.Tensor:
    """Return the ``[out, in]`` weights of 1-D linear interpolation.

    PyTorch's rule (``area_pixel_compute_source_index``): output ``i``
    reads source ``s = (i + 0.5) in/out - 0.5`` clamped to ``[0, in - 1]``
    (``s = i (in-1)/(out-1)`` with ``align_corners``), weight ``1 - |s - j|``
    on the two nearest inputs ``j``.

    Args:
        in_size (int): Input length.
        out_size (int): Output length.
        align_corners (bool): As ``F.interpolate``'s.
        like (Tensor): Gives the dtype and device.

    Returns:
        Tensor: The matrix, rows summing to 1.
    """
    dst = torch.arange(out_size, dtype=torch.float64, device=like.device)
    if align_corners:
        scale = (in_size - 1) / (out_size - 1) if out_size > 1 else 0.0
        src = dst * scale
    else:
        src = (dst + 0.5) * (in_size / out_size) - 0.5
    src = src.clamp(min=0, max=in_size - 1)
    grid = torch.arange(in_size, dtype=torch.float64, device=like.device)
    weights = (1 - (src[:, None] - grid[None, :]).abs()).clamp(min=0)
    return weights.to(like.dtype)


def whole_image_logits(fwd: ForwardPass, what: str) -> torch.Tensor:
    """Return the logits of a whole-image forward.

    Raises:
        ValueError: If the forward made more than one classifier call.
    """
    if len(fwd.head_outputs) != 1:
        raise ValueError(
            f'{what} trains on the whole image, as CoTTA\'s ACDC code does: '
            "use whole inference (model.test_cfg.mode='whole'), got "
            f'{len(fwd.head_outputs)} classifier calls per image')
    return fwd.head_outputs[0][1]
