""":class:`~mmseg_stag.core.stag.HardAlignment`'s math as two Triton kernels.

``STAGLoss(triton=True)``: one kernel for the forward (``||h||``, the
softmax, the argmax and every per-sample coefficient, reading ``h`` and
``z`` once) and one for the backward (``dL/dz`` and ``dL/dh = c h``), each
a single launch, where the eager path dispatches ~40 ops; given ``||h||``
(``stag.tap_feature_norm``) neither reads ``h``, and the backward writes
``dL/d||h||`` instead of ``dL/dh``. The formulas are
:func:`~mmseg_stag.core.stag.hard_alignment_forward`'s and
``hard_alignment_backward``'s, line for line (docs/stag-loss.md, "The
analytic backward"); the norm and the scale of ``dL/dh`` stay in the
compute dtype where the eager path rounds them to a bf16/fp16 feature
dtype. CUDA tensors; CPU tensors only under ``TRITON_INTERPRET=1``
(Triton's interpreter: the tests).
"""
import os

import torch
import triton
import triton.language as tl


def interpreting() -> bool:
    return os.environ.get('TRITON_INTERPRET', '0') == '1'


def check_device(tensor: torch.Tensor,
                 option: str = 'STAGLoss(triton=True)',
                 instead: str = '') -> None:
    """``ValueError`` unless Triton's kernels can run on ``tensor``,
    naming the ``option`` that launches them (and what to use
    ``instead``)."""
    if not tensor.is_cuda and not interpreting():
        raise ValueError(
            f'{option} runs on CUDA tensors, got a {tensor.device.type} '
            "tensor (on the CPU only under Triton's interpreter, "
            f'TRITON_INTERPRET=1){instead}')


def _forward_kernel(z_ptr, h_ptr, x_ptr, norm_ptr, table_ptr, eps_ptr,
                    out_ptr, pred_ptr, rows, M, C, D, z_sn, z_sc, z_sm,
                    h_sn, h_sd, h_sm, x_sn, x_sc, x_sm, n_sn, n_sm,
                    TINY: tl.constexpr, HAS_X: tl.constexpr,
                    HAS_NORM: tl.constexpr, DTYPE: tl.constexpr,
                    BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr,
                    BLOCK_D: tl.constexpr):
    """Rows ``r = n M + m``; ``out [6, rows]``: rho, e, v, w, c, dp
    (what the bias and a projection matrix take back, times ``s_y`` when
    the projections come from the logits); ``c``: ``dL/d||h||``, over
    ``||h||`` unless ``HAS_NORM`` (``||h||`` given: the tap's)."""
    r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    live = r < rows
    n = r // M
    m = r - n * M
    if HAS_NORM:
        norm = tl.load(norm_ptr + n * n_sn + m * n_sm, mask=live,
                       other=0.0).to(DTYPE)
    else:
        # ||h||: the D-sized pass, accumulated in the compute dtype
        sq = tl.zeros([BLOCK_R], dtype=DTYPE)
        for d0 in range(0, D, BLOCK_D):
            d = d0 + tl.arange(0, BLOCK_D)
            h = tl.load(h_ptr + n[:, None] * h_sn + d[None, :] * h_sd
                        + m[:, None] * h_sm,
                        mask=live[:, None] & (d < D)[None, :], other=0.0)
            h = h.to(DTYPE)
            sq += tl.sum(h * h, axis=1)
        if DTYPE == tl.float64:  # sqrt_rn takes float32 only
            norm = tl.sqrt(sq)
        else:  # IEEE-rounded, not the approximate tl.sqrt
            norm = tl.sqrt_rn(sq)
    # log_softmax, -H, argmax (first on ties), as torch computes them
    k = tl.arange(0, BLOCK_C)
    cls = (k < C)[None, :]
    z = tl.load(z_ptr + n[:, None] * z_sn + k[None, :] * z_sc
                + m[:, None] * z_sm, mask=live[:, None] & cls,
                other=float('-inf')).to(DTYPE)
    z = tl.where(live[:, None], z, 0.0)  # finite rows past the end
    z_y = tl.max(z, axis=1)
    y = tl.argmax(z, axis=1, tie_break_left=True)
    shifted = z - z_y[:, None]
    log_sum = tl.log(tl.sum(tl.where(cls, tl.exp(shifted), 0.0), axis=1))
    log_p = tl.where(cls, shifted - log_sum[:, None], 0.0)
    p = tl.where(cls, tl.exp(log_p), 0.0)
    neg_h = tl.sum(p * log_p, axis=1)
    log_py = 0.0 - log_sum  # shifted is 0 at the argmax
    scale = tl.load(table_ptr + y * 3, mask=live, other=0.0)
    b_y = tl.load(table_ptr + y * 3 + 1, mask=live, other=0.0)
    anchor_norm = tl.load(table_ptr + y * 3 + 2, mask=live, other=0.0)
    if HAS_X:  # P = (matrix @ x)_y, given
        proj = tl.load(x_ptr + n * x_sn + y * x_sc + m * x_sm, mask=live,
                       other=0.0).to(DTYPE)
    else:
        proj = (z_y - b_y) * scale
    eps = tl.load(eps_ptr)
    # 1 / rows in the compute dtype (rows may be a constexpr 1)
    inv_size = 1.0 / (tl.zeros([BLOCK_R], dtype=DTYPE) + rows)
    t = log_py - neg_h
    p_y = tl.exp(log_py)
    sn = p_y * t
    abs_sn_alpha = tl.abs(sn) * anchor_norm
    inv_d = 1.0 / (eps + abs_sn_alpha * norm)
    q = proj * inv_d
    rho = sn * q
    cos = sn * inv_d
    e = q * (p_y * inv_d) * (eps * inv_size)
    e_t1 = e + e * t
    v = e_t1 - e * neg_h
    dp = cos * inv_size
    if HAS_X:
        w = e_t1
    else:
        w = e_t1 + dp * scale
        dp = dp * scale
    if HAS_NORM:
        c = rho * (abs_sn_alpha * inv_d) * (-inv_size)
    else:
        # finfo(dtype).tiny, made in the compute dtype (a literal is
        # float32)
        tiny = tl.full([BLOCK_R], TINY, DTYPE)
        c = rho / tl.maximum(norm, tiny) * (abs_sn_alpha * inv_d) * (
            -inv_size)
    tl.store(out_ptr + r, rho, mask=live)
    tl.store(out_ptr + rows + r, e, mask=live)
    tl.store(out_ptr + 2 * rows + r, v, mask=live)
    tl.store(out_ptr + 3 * rows + r, w, mask=live)
    tl.store(out_ptr + 4 * rows + r, c, mask=live)
    tl.store(out_ptr + 5 * rows + r, dp, mask=live)
    tl.store(pred_ptr + r, y.to(tl.int64), mask=live)


def _backward_kernel(z_ptr, h_ptr, out_ptr, pred_ptr, grad_ptr, gz_ptr,
                     gh_ptr, rows, M, C, D, z_sn, z_sc, z_sm, h_sn, h_sd,
                     h_sm, HAS_NORM: tl.constexpr, DTYPE: tl.constexpr,
                     BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr,
                     BLOCK_D: tl.constexpr):
    """``dL/dz = (-p (e log p + v) + onehot(y) w) g`` into ``gz`` (laid
    out as ``z``, contiguous) and ``dL/dh = h (c g)`` into ``gh`` (as
    ``h``, contiguous), or with ``HAS_NORM`` ``dL/d||h|| = c g`` (``gh``
    then ``[rows]``)."""
    r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    live = r < rows
    n = r // M
    m = r - n * M
    g = tl.load(grad_ptr).to(DTYPE)
    k = tl.arange(0, BLOCK_C)
    cls = (k < C)[None, :]
    tile = live[:, None] & cls
    z = tl.load(z_ptr + n[:, None] * z_sn + k[None, :] * z_sc
                + m[:, None] * z_sm, mask=tile,
                other=float('-inf')).to(DTYPE)
    z = tl.where(live[:, None], z, 0.0)
    shifted = z - tl.max(z, axis=1)[:, None]
    log_sum = tl.log(tl.sum(tl.where(cls, tl.exp(shifted), 0.0), axis=1))
    log_p = tl.where(cls, shifted - log_sum[:, None], 0.0)
    p = tl.where(cls, tl.exp(log_p), 0.0)
    e = tl.load(out_ptr + rows + r, mask=live, other=0.0)
    v = tl.load(out_ptr + 2 * rows + r, mask=live, other=0.0)
    w = tl.load(out_ptr + 3 * rows + r, mask=live, other=0.0)
    c = tl.load(out_ptr + 4 * rows + r, mask=live, other=0.0)
    y = tl.load(pred_ptr + r, mask=live, other=0)
    gz = p * -(v[:, None] + e[:, None] * log_p)
    gz = tl.where(k[None, :] == y[:, None], gz + w[:, None], gz) * g
    tl.store(gz_ptr + n[:, None] * (C * M) + k[None, :] * M + m[:, None],
             gz, mask=tile)
    scale = c * g
    if HAS_NORM:
        tl.store(gh_ptr + r, scale, mask=live)
    else:
        for d0 in range(0, D, BLOCK_D):
            d = d0 + tl.arange(0, BLOCK_D)
            at = live[:, None] & (d < D)[None, :]
            h = tl.load(h_ptr + n[:, None] * h_sn + d[None, :] * h_sd
                        + m[:, None] * h_sm, mask=at, other=0.0)
            tl.store(gh_ptr + n[:, None] * (D * M) + d[None, :] * M
                     + m[:, None], (h.to(DTYPE) * scale[:, None]).to(
                         h.dtype), mask=at)


_JIT = {}


def _kernel(fn):
    """``fn`` compiled by Triton, or interpreted (``TRITON_INTERPRET=1``,
    read at each call: Triton reads it once, when a kernel is defined)."""
    key = (fn.__name__, interpreting())
    if key not in _JIT:
        if key[1]:
            from triton.runtime.interpreter import InterpretedFunction
            _JIT[key] = InterpretedFunction(fn)
        else:
            _JIT[key] = triton.jit(fn)
    return _JIT[key]


#: the kernels' warps per program: a tile of ``BLOCK_R x BLOCK_D`` <= 2048
#: features is 16 values a thread
NUM_WARPS = 4


def _blocks(rows, num_classes, multiprocessors):
    """``(BLOCK_R, BLOCK_C, BLOCK_D)``: a logits tile of up to 4096 values
    and a feature tile of 2048; rows per program a power of two up to 128,
    as many as still give each of the GPU's ``multiprocessors`` at least 4
    programs. The kernels stream ``h``: on an H100 (132 SMs) a B5
    per-pixel term at 960x540 (32,400 rows) in 128-row programs is 254
    programs, under 2 an SM (8 warps of its 64); in 32-row ones each SM
    holds ~8 at once (~30 warps: 56 registers a thread, no spill), ~4x
    the loads in flight. A ResNet-50 batch of 64 runs a sample a program.
    Reasoned from the compiled kernels (tests/core/test_stag_triton.py
    compiles them for sm_90), not yet timed on a GPU."""
    block_c = triton.next_power_of_2(num_classes)
    block_r = 128
    while block_r > 1 and triton.cdiv(rows, block_r) < 4 * multiprocessors:
        block_r //= 2
    block_r = min(block_r, max(1, 4096 // block_c))
    return block_r, block_c, 2048 // block_r


def _multiprocessors(tensor):
    """The GPU's SM count (a cached property: no device wait); 1 in the
    interpreter, where only the largest blocks matter."""
    if not tensor.is_cuda:
        return 1
    return torch.cuda.get_device_properties(
        tensor.device).multi_processor_count


def _check_size(features, logits, rows):
    """``ValueError`` past the kernels' 32-bit offsets."""
    spans = {name: 1 + sum((s - 1) * abs(t) for s, t in zip(
        tensor.shape, tensor.stride()))
        for name, tensor in (('features', features), ('logits', logits))}
    spans['the 6 coefficients of each of the rows'] = 6 * rows
    for name, span in spans.items():
        if span > 2**31 - 1:
            raise ValueError(
                f'STAGLoss(triton=True): {name} span {span} elements, past '
                "the kernels' 32-bit offsets (features "
                f'{tuple(features.shape)}, logits {tuple(logits.shape)}); '
                'use the default term (triton=False)')


def _dtype(tensor):
    return tl.float64 if tensor.dtype == torch.float64 else tl.float32


def hard_alignment_forward(features, logits, table, eps: float, eps_tensor,
                           matrix, on_features: bool, bias_grad: bool,
                           norm=None):
    """The Triton twin of :func:`~mmseg_stag.core.stag.
    hard_alignment_forward`: ``(mean L_STAG, saved)``."""
    n, d, m = features.shape
    num_classes, rows = logits.shape[1], n * m
    x = None
    if matrix is not None:  # the projections, then picked at the argmax
        x = torch.matmul(matrix, features) if on_features else \
            torch.matmul(matrix, logits - table[:, 1].view(1, -1, 1))
    _check_size(features, logits, rows)
    out = logits.new_empty((6, rows))
    pred = torch.empty(rows, dtype=torch.long, device=logits.device)
    block_r, block_c, block_d = _blocks(rows, num_classes,
                                        _multiprocessors(logits))
    xs = x if x is not None else logits
    norms = norm if norm is not None else logits
    _kernel(_forward_kernel)[(triton.cdiv(rows, block_r), )](
        logits, features, xs, norms, table, eps_tensor, out, pred, rows, m,
        num_classes, d, *logits.stride(), *features.stride(), *xs.stride(),
        norms.stride(0), norms.stride(2),
        TINY=torch.finfo(logits.dtype).tiny, HAS_X=x is not None,
        HAS_NORM=norm is not None, DTYPE=_dtype(logits), BLOCK_R=block_r,
        BLOCK_C=block_c, BLOCK_D=block_d, num_warps=NUM_WARPS)
    return out[0].mean(), (logits, out, pred)


def hard_alignment_backward(grad, features, logits, out, pred,
                            tapped: bool = False):
    """The Triton twin of ``hard_alignment_backward`` (``features`` None
    where ``tapped`` and the projections are not on them: not read)."""
    n, num_classes, m = logits.shape
    rows = n * m
    grad_z = torch.empty((n, num_classes, m), dtype=logits.dtype,
                         device=logits.device)
    if tapped:  # dL/d||h||, [N, 1, M]
        grad_h, feats = logits.new_empty((n, 1, m)), logits
    else:
        grad_h, feats = torch.empty_like(
            features, memory_format=torch.contiguous_format), features
    block_r, block_c, block_d = _blocks(rows, num_classes,
                                        _multiprocessors(logits))
    _kernel(_backward_kernel)[(triton.cdiv(rows, block_r), )](
        logits, feats, out, pred, grad, grad_z, grad_h, rows, m,
        num_classes, feats.shape[1], *logits.stride(), *feats.stride(),
        HAS_NORM=tapped, DTYPE=_dtype(logits), BLOCK_R=block_r,
        BLOCK_C=block_c, BLOCK_D=block_d, num_warps=NUM_WARPS)
    return (None if tapped else grad_h, grad_z, pred.view(n, 1, m),
            out[5].view(n, 1, m), grad_h if tapped else None)
