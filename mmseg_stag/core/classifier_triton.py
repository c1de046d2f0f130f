"""The classifier and ``||h||`` in one pass over the features (Triton).

``stag.norm_tap='fused'``: the classifier (a 1x1 ``Conv2d`` or a
``Linear``) runs as a Triton GEMM that also sums the squares of the
features it reads, so ``||h||`` for the STAG term costs no pass of its own;
its backward adds the term's ``h dL/d||h|| / ||h||`` to ``dL/dh = W^T
dL/dz`` in the GEMM's epilogue, so the term's gradient costs one read of
``h`` instead of the tap's three passes (:class:`~mmseg_stag.core.stag.
FeatureNormTap`: the classifier's gradient written, then read again with
``h`` and written once more). Per forward and backward the features move
once beside the classifier's own traffic, where the tap moves them 4
times and the untapped term 6 (counted on the CPU:
tests/core/methods/test_norm_tap_methods.py).

The same values as the module and :func:`~mmseg_stag.core.stag.
tap_feature_norm`, to the GEMM's rounding: under autocast the GEMM runs in
its dtype (the features, weight and bias cast as ``F.conv2d`` would cast
them), accumulating in float32; in float32 with TF32 where PyTorch's op on
that device would use it (``torch.backends.cudnn.allow_tf32`` for a
convolution, ``torch.backends.cuda.matmul.allow_tf32`` for a linear layer,
never on the CPU). CUDA tensors; CPU tensors only under Triton's
interpreter (``TRITON_INTERPRET=1``, the tests).
"""
from typing import Tuple

import torch
import triton
import triton.language as tl
from torch import nn
from torch.autograd.function import once_differentiable

from . import stag_triton
from .stag_triton import _kernel, _multiprocessors, interpreting


def _classify_kernel(h_ptr, w_ptr, b_ptr, z_ptr, norm_ptr, M, C, D,
                     h_sn, h_sd, h_sm, w_sc, w_sd, z_sn, z_sc, z_sm,
                     n_sn, n_sm, HAS_BIAS: tl.constexpr,
                     PRECISION: tl.constexpr, ACC: tl.constexpr,
                     UPCAST: tl.constexpr, BLOCK_M: tl.constexpr,
                     BLOCK_C: tl.constexpr, BLOCK_K: tl.constexpr):
    """``z[n, :, m] = W h[n, :, m] + b`` for a tile of ``BLOCK_C`` classes
    and ``BLOCK_M`` samples (pixels), ``h`` cast to ``W``'s dtype as
    autocast casts it, and, from the class tile 0, ``||h[n, :, m]||`` of
    ``h`` as given, its squares summed from the tiles the GEMM loads.
    ``UPCAST``: half-float tiles multiplied as float32 (Triton's
    interpreter multiplies them as integers)."""
    pid_m, pid_c, n = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    k = pid_c * BLOCK_C + tl.arange(0, BLOCK_C)
    live_m, live_k = m < M, k < C
    acc = tl.zeros([BLOCK_C, BLOCK_M], dtype=ACC)
    sq = tl.zeros([BLOCK_M], dtype=ACC)
    for d0 in range(0, D, BLOCK_K):
        d = d0 + tl.arange(0, BLOCK_K)
        h = tl.load(h_ptr + n * h_sn + d[:, None] * h_sd + m[None, :] * h_sm,
                    mask=(d < D)[:, None] & live_m[None, :], other=0.0)
        w = tl.load(w_ptr + k[:, None] * w_sc + d[None, :] * w_sd,
                    mask=live_k[:, None] & (d < D)[None, :], other=0.0)
        hf = h.to(ACC)
        sq += tl.sum(hf * hf, axis=0)
        x = h.to(w.dtype)  # in registers: no D-sized copy
        if UPCAST:
            x, w = x.to(tl.float32), w.to(tl.float32)
        acc = tl.dot(w, x, acc, input_precision=PRECISION, out_dtype=ACC)
    if HAS_BIAS:
        acc += tl.load(b_ptr + k, mask=live_k, other=0.0).to(ACC)[:, None]
    tl.store(z_ptr + n * z_sn + k[:, None] * z_sc + m[None, :] * z_sm,
             acc.to(z_ptr.dtype.element_ty),
             mask=live_k[:, None] & live_m[None, :])
    if pid_c == 0:
        if ACC == tl.float64:  # sqrt_rn takes float32 only
            norm = tl.sqrt(sq)
        else:  # IEEE-rounded, not the approximate tl.sqrt
            norm = tl.sqrt_rn(sq)
        tl.store(norm_ptr + n * n_sn + m * n_sm,
                 norm.to(norm_ptr.dtype.element_ty), mask=live_m)


def _grad_kernel(g_ptr, w_ptr, h_ptr, gn_ptr, norm_ptr, gh_ptr, M, C, D,
                 g_sn, g_sc, g_sm, w_sc, w_sd, h_sn, h_sd, h_sm, o_sn, o_sd,
                 o_sm, gn_sn, gn_sm, n_sn, n_sm,
                 HAS_NORM: tl.constexpr, PRECISION: tl.constexpr,
                 ACC: tl.constexpr, UPCAST: tl.constexpr,
                 BLOCK_M: tl.constexpr, BLOCK_C: tl.constexpr,
                 BLOCK_D: tl.constexpr):
    """``dL/dh[n, :, m] = W^T dL/dz[n, :, m]`` for a tile of ``BLOCK_D``
    features and ``BLOCK_M`` samples, plus, with ``HAS_NORM``, ``h[n, :, m]
    dL/d||h|| / ||h||`` (0 where ``||h|| = 0``) in the epilogue, into
    ``gh`` (strides ``o_s*``)."""
    pid_m, pid_d, n = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    d = pid_d * BLOCK_D + tl.arange(0, BLOCK_D)
    live_m, live_d = m < M, d < D
    acc = tl.zeros([BLOCK_D, BLOCK_M], dtype=ACC)
    for c0 in range(0, C, BLOCK_C):
        k = c0 + tl.arange(0, BLOCK_C)
        wt = tl.load(w_ptr + k[None, :] * w_sc + d[:, None] * w_sd,
                     mask=(k < C)[None, :] & live_d[:, None], other=0.0)
        g = tl.load(g_ptr + n * g_sn + k[:, None] * g_sc + m[None, :] * g_sm,
                    mask=(k < C)[:, None] & live_m[None, :], other=0.0)
        g = g.to(wt.dtype)
        if UPCAST:
            g, wt = g.to(tl.float32), wt.to(tl.float32)
        acc = tl.dot(wt, g, acc, input_precision=PRECISION, out_dtype=ACC)
    tile = live_d[:, None] & live_m[None, :]
    if HAS_NORM:
        norm = tl.load(norm_ptr + n * n_sn + m * n_sm, mask=live_m,
                       other=0.0).to(ACC)
        gn = tl.load(gn_ptr + n * gn_sn + m * gn_sm, mask=live_m,
                     other=0.0).to(ACC)
        scale = tl.where(norm > 0, gn / tl.where(norm > 0, norm, 1.0), 0.0)
        h = tl.load(h_ptr + n * h_sn + d[:, None] * h_sd + m[None, :] * h_sm,
                    mask=tile, other=0.0).to(ACC)
        acc += h * scale[None, :]
    tl.store(gh_ptr + n * o_sn + d[:, None] * o_sd + m[None, :] * o_sm,
             acc.to(gh_ptr.dtype.element_ty), mask=tile)


#: warps per program
NUM_WARPS = 4
#: the largest tiles: 64 samples (pixels) by 64 features or 64 classes
BLOCK = 64


def _halve_until_enough(blocks, sizes, wanted):
    """``blocks`` (powers of two, >= 16: ``tl.dot``'s least), each halved
    in turn while the grid over ``sizes`` has fewer than ``wanted``
    programs."""
    blocks = list(blocks)
    for i in range(len(blocks)):
        while blocks[i] > 16 and _programs(blocks, sizes) < wanted:
            blocks[i] //= 2
    return blocks


def _programs(blocks, sizes):
    count = 1
    for block, size in zip(blocks, sizes):
        count *= triton.cdiv(size, block)
    return count


def _class_tile(num_classes):
    """Classes a tile holds: the next power of two, 16 to 64."""
    return min(max(16, triton.next_power_of_2(num_classes)), BLOCK)


def _blocks(batch, samples, num_classes, dim, multiprocessors):
    """``((BLOCK_M, BLOCK_C), (BLOCK_M, BLOCK_D))`` of the forward and
    the backward: 64-wide tiles (classes: the next power of two, 16 to
    64), narrowed until each of the GPU's ``multiprocessors`` gets 2
    programs where the sizes allow. The B5 at 960x540 (32,400 pixels, 768
    features, 19 classes) keeps 64 x 32 and 64 x 64: a forward of 507
    programs (~4 an H100 SM, 94 registers a thread, the features' tiles
    pipelined through shared memory in 3 stages), a backward of 507 x 12;
    a ResNet-50's fc at batch 64 (1,000 classes, 2,048 features) narrows
    to 16-sample tiles of 16 classes (252 programs, not 16) and of 16
    features (512, not 32). Reasoned from the code compiled for sm_90
    (tests/core/test_stag_triton.py), not yet timed on a GPU."""
    wanted = 2 * multiprocessors
    block_c = _class_tile(num_classes)
    forward = _halve_until_enough((BLOCK, block_c), (samples, num_classes),
                                  wanted / batch)
    backward = _halve_until_enough((BLOCK, BLOCK), (samples, dim),
                                   wanted / batch)
    return tuple(forward), tuple(backward)


def _acc(dtype):
    return tl.float64 if dtype == torch.float64 else tl.float32


def _upcast(dtype) -> bool:
    return interpreting() and dtype in (torch.float16, torch.bfloat16)


def _precision(dtype, tf32: bool) -> str:
    return 'tf32' if tf32 and dtype == torch.float32 else 'ieee'


class FusedClassifier(torch.autograd.Function):
    """``(z, ||h||)`` of ``h [B, D, M]`` (any strides), ``W [C, D]`` and
    ``b [C]`` (or None) of the GEMM's dtype (``h`` cast to it in the
    kernels); ``z [B, C, M]`` of that dtype, contiguous or, ``per_sample``
    (``B = 1``, the batch as ``M``), as ``z[0].t()`` contiguous; ``||h||
    [B, 1, M]`` of ``h``, float32 for half features. ``tf32``: the float32
    GEMM's inputs in TF32."""

    @staticmethod
    def forward(ctx, features, weight, bias, per_sample, tf32):
        batch, dim, samples = features.shape
        num_classes = weight.shape[0]
        like = dict(dtype=weight.dtype, device=features.device)
        z = torch.empty((samples, num_classes), **like).t().unsqueeze(0) \
            if per_sample else torch.empty((batch, num_classes, samples),
                                           **like)
        half = features.dtype in (torch.float16, torch.bfloat16)
        norm = torch.empty((batch, 1, samples), device=features.device,
                           dtype=torch.float32 if half else features.dtype)
        _check_size(features, z)
        (block_m, block_c), _ = _blocks(batch, samples, num_classes, dim,
                                        _multiprocessors(features))
        _kernel(_classify_kernel)[(triton.cdiv(samples, block_m),
                                   triton.cdiv(num_classes, block_c),
                                   batch)](
            features, weight, weight if bias is None else bias, z, norm,
            samples, num_classes, dim, *features.stride(), *weight.stride(),
            *z.stride(), norm.stride(0), norm.stride(2),
            HAS_BIAS=bias is not None,
            PRECISION=_precision(weight.dtype, tf32),
            ACC=_acc(weight.dtype), UPCAST=_upcast(weight.dtype),
            BLOCK_M=block_m, BLOCK_C=block_c, BLOCK_K=BLOCK,
            num_warps=NUM_WARPS)
        ctx.save_for_backward(features, weight, norm)
        ctx.tf32 = tf32
        return z, norm

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_z, grad_norm):
        features, weight, norm = ctx.saved_tensors
        grad_h = grad_w = grad_b = None
        if grad_z is None:  # only the norm was used
            grad_z = torch.zeros((features.shape[0], weight.shape[0],
                                  features.shape[2]), dtype=weight.dtype,
                                 device=features.device)
        if ctx.needs_input_grad[0]:
            grad_h = torch.empty_like(features)
            batch, dim, samples = features.shape
            num_classes = weight.shape[0]
            has_norm = grad_norm is not None
            gn = grad_norm.expand_as(norm) if has_norm else norm
            _, (block_m, block_d) = _blocks(batch, samples, num_classes,
                                            dim, _multiprocessors(features))
            _kernel(_grad_kernel)[(triton.cdiv(samples, block_m),
                                   triton.cdiv(dim, block_d), batch)](
                grad_z, weight, features, gn, norm, grad_h, samples,
                num_classes, dim, *grad_z.stride(), *weight.stride(),
                *features.stride(), *grad_h.stride(), gn.stride(0),
                gn.stride(2), norm.stride(0), norm.stride(2),
                HAS_NORM=has_norm,
                PRECISION=_precision(weight.dtype, ctx.tf32),
                ACC=_acc(weight.dtype), UPCAST=_upcast(weight.dtype),
                BLOCK_M=block_m, BLOCK_C=_class_tile(num_classes),
                BLOCK_D=block_d, num_warps=NUM_WARPS)
        if ctx.needs_input_grad[1]:  # a trained classifier: sum_n g h^T
            grad_w = torch.einsum('ncm,ndm->cd', grad_z,
                                  features.to(grad_z.dtype))
        if ctx.needs_input_grad[2]:
            grad_b = grad_z.sum((0, 2))
        return grad_h, grad_w, grad_b, None, None


def _check_size(features, logits):
    """``ValueError`` past the kernels' 32-bit offsets."""
    for name, tensor in (('features', features), ('logits', logits)):
        span = 1 + sum((s - 1) * abs(t)
                       for s, t in zip(tensor.shape, tensor.stride()))
        if span > 2**31 - 1:
            raise ValueError(
                f"stag.norm_tap='fused': the classifier's {name} "
                f'{tuple(tensor.shape)} span {span} elements, past the '
                "kernels' 32-bit offsets; use norm_tap=True")


def check_fused_classifier(module: nn.Module, name: str = 'classifier'
                           ) -> None:
    """``ValueError`` unless ``module`` is a ``Linear`` or a 1x1
    ``Conv2d`` (stride 1, no padding, one group) the kernels can run (a
    1x1 kernel's dilation changes nothing, nor does ``padding='same'``)."""
    if isinstance(module, nn.Linear):
        return
    if isinstance(module, nn.Conv2d) and module.kernel_size == (1, 1) and \
            module.stride == (1, 1) and module.groups == 1 and \
            module.padding in ((0, 0), 'valid', 'same'):
        return
    raise ValueError(
        f"stag.norm_tap='fused' runs the classifier {name!r} as a GEMM: it "
        'must be an nn.Linear or a 1x1 nn.Conv2d with stride 1, no padding '
        f'and one group, got {module!r}; use norm_tap=True')


def check_device(tensor: torch.Tensor) -> None:
    """``ValueError`` unless the kernels can run on ``tensor``."""
    stag_triton.check_device(tensor, "stag.norm_tap='fused'",
                             '; use norm_tap=True')


def classify_with_norm(module: nn.Module, features: torch.Tensor
                       ) -> Tuple[torch.Tensor, torch.Tensor]:
    """``(module(features), ||features||)`` over dim 1 (keepdim; float32
    for half features), in one pass over the features forward and one
    backward (:class:`FusedClassifier`); ``module`` as
    :func:`check_fused_classifier` takes."""
    check_device(features)
    conv = isinstance(module, nn.Conv2d)
    if features.dim() != (4 if conv else 2):
        raise ValueError(f'{type(module).__name__} classifier got features '
                         f'of shape {tuple(features.shape)}')
    weight, bias = module.weight.flatten(1), module.bias
    device = features.device.type
    if torch.is_autocast_enabled(device):
        dtype = torch.get_autocast_dtype(device)
    elif module.weight.dtype != features.dtype:  # as the module would
        raise ValueError(
            f'{type(module).__name__} classifier of {module.weight.dtype} '
            f'got {features.dtype} features outside autocast')
    else:
        dtype = features.dtype
    tf32 = features.is_cuda and (
        torch.backends.cudnn.allow_tf32 if conv else
        torch.backends.cuda.matmul.allow_tf32)
    # the casts autocast would make (tracked: a trained W gets its grad);
    # the features' in the kernels
    weight = weight.to(dtype)
    bias = None if bias is None else bias.to(dtype)
    with torch.autocast(device_type=device, enabled=False):
        if conv:
            n, _, height, width = features.shape
            z, norm = FusedClassifier.apply(features.flatten(2), weight,
                                            bias, False, tf32)
            return (z.view(n, -1, height, width),
                    norm.view(n, 1, height, width))
        # per sample: the batch as the GEMM's samples, z [N, C] contiguous
        z, norm = FusedClassifier.apply(features.t().unsqueeze(0), weight,
                                        bias, True, tf32)
        return z[0].t(), norm.view(-1, 1)
