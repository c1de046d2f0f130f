"""``STAGLoss(triton=True)``: the hard-label term as two Triton kernels, run
here by Triton's interpreter (``TRITON_INTERPRET=1``, NumPy on the CPU;
tests/cuda runs them compiled on a GPU). Equal to the eager written-out
backward in float64 for every anchor mode, a frozen, trainable or
bias-only classifier, per sample and per pixel; two launches and a few
dispatched ops per forward and backward, no host read."""
import json
import os
import subprocess
import sys

import pytest
import torch

from host_syncs import HostSyncCounter, count_dispatched_ops, watch_launches
from mmseg_stag.analysis.step_benchmark import capture_graph
from mmseg_stag.core import STAGLoss, stag
from test_stag_analytic import (logits_of, make_inputs, one_step, rel,
                                value_and_grads)

pytest.importorskip('triton')
from mmseg_stag.core import stag_triton  # noqa: E402
import triton_aot  # noqa: E402

#: CPU tensors through the interpreter (tests/conftest.py sets it where no
#: GPU is); on a GPU machine the tests marked cuda run the kernels compiled
interpreted = pytest.mark.skipif(
    not stag_triton.interpreting(), reason='TRITON_INTERPRET is not 1')


@interpreted
@pytest.mark.parametrize('per_pixel', [False, True])
@pytest.mark.parametrize('trainable', [False, True])
@pytest.mark.parametrize('anchor', ['diagonal', 'full'])
@pytest.mark.parametrize('eps', [1e-8, 0.1])
def test_kernels_equal_the_eager_backward_in_float64(per_pixel, trainable,
                                                     anchor, eps):
    feats, weight, bias = make_inputs(per_pixel, trainable, c=19)
    got = value_and_grads(STAGLoss(eps=eps, anchor=anchor, triton=True),
                          feats, weight, bias, tie=True)
    ref = value_and_grads(STAGLoss(eps=eps, anchor=anchor,
                                   analytic_backward=True),
                          feats, weight, bias, tie=True)
    assert rel(got[0], ref[0]) <= 1e-12
    for a, b in zip(got[1], ref[1]):
        assert rel(a, b) <= 1e-12
    assert all(torch.isfinite(g).all() for g in got[1])  # ||h|| = 0 too


@interpreted
@pytest.mark.parametrize('anchor', ['diagonal', 'full'])
def test_a_bias_trained_beside_a_frozen_weight_gets_its_gradient(anchor):
    """``dL/db``: the logits' gradient summed over pixels, less what
    ``P`` takes back; it cancels to ~1e-7 of its terms, so it is compared
    on their scale."""
    feats, weight, bias = make_inputs(True, False, c=19)
    grads = []
    for options in (dict(triton=True), dict(analytic_backward=True),
                    dict(analytic_backward=False)):
        b = bias.clone().requires_grad_()
        h = feats.clone().requires_grad_()
        z = logits_of(h, weight, b)
        z.retain_grad()
        STAGLoss(anchor=anchor, **options)(h, z, weight, b).backward()
        grads.append((h.grad, b.grad, z.grad.abs().sum((0, 2, 3)).max()))
    for other in grads[1:]:
        assert rel(grads[0][0], other[0]) <= 1e-12
        assert (grads[0][1] - other[1]).abs().max() <= 1e-12 * other[2]


@interpreted
@pytest.mark.parametrize('num_classes', [3, 1000])
def test_many_classes_and_a_strided_layout(num_classes):
    """ImageNet's 1000 classes (one tile row per sample) and
    channels-last features (strides, not copies)."""
    feats, weight, bias = make_inputs(True, False, c=num_classes, d=9)
    feats = feats.contiguous(memory_format=torch.channels_last)
    got = value_and_grads(STAGLoss(triton=True), feats, weight, bias)
    ref = value_and_grads(STAGLoss(analytic_backward=True), feats, weight,
                          bias)
    for a, b in zip((got[0], ) + got[1], (ref[0], ) + ref[1]):
        assert rel(a, b) <= 1e-12


@interpreted
def test_float32_and_bfloat16_features():
    """float32: the eager term to float32's rounding; bf16 features (the
    logits upcast): closer to the float32 term than the eager path, which
    rounds ``||h||`` and ``dL/dh``'s scale to bf16."""
    feats, weight, bias = make_inputs(True, False, c=19, d=32)
    feats, weight, bias = feats.float(), weight.float(), bias.float()
    got = value_and_grads(STAGLoss(triton=True), feats, weight, bias)
    ref = value_and_grads(STAGLoss(analytic_backward=True), feats, weight,
                          bias)
    for a, b in zip((got[0], ) + got[1], (ref[0], ) + ref[1]):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)
    h16 = feats.bfloat16()
    exact = value_and_grads(STAGLoss(analytic_backward=True),
                            h16.float(), weight, bias)

    def bf16(options):
        h = h16.clone().requires_grad_()
        z = logits_of(h.float(), weight, bias)
        z.retain_grad()
        value = STAGLoss(**options)(h, z, weight, bias)
        value.backward()
        assert h.grad.dtype == torch.bfloat16
        return value.detach(), (h.grad.float(), z.grad)
    got, eager = bf16(dict(triton=True)), bf16(dict(analytic_backward=True))
    for g, e, x in zip((got[0], ) + got[1], (eager[0], ) + eager[1],
                       (exact[0], ) + exact[1]):
        assert rel(g, x) <= rel(e, x) + 1e-7
        assert rel(g, x) < 1e-2


def launches_and_ops(step, monkeypatch):
    """``(kernel launches, dispatched ops)`` of ``step()``."""
    launches = []
    watch_launches(monkeypatch,
                   lambda fn, args: launches.append(fn.__name__))
    ops = count_dispatched_ops(step)
    return launches, ops


def check_launches_ops_and_syncs(per_pixel, monkeypatch, device='cpu'):
    step = one_step(STAGLoss(check_finite=False, triton=True), per_pixel,
                    device=device)
    launches, ops = launches_and_ops(step, monkeypatch)
    assert launches == ['_forward_kernel', '_backward_kernel']
    assert len(ops) + len(launches) <= 8, ops
    counter = HostSyncCounter()
    with counter:
        step()
    assert counter.calls == []


@interpreted
@pytest.mark.parametrize('per_pixel', [False, True])
def test_two_launches_few_ops_and_no_host_read(per_pixel, monkeypatch):
    """One forward and backward: a kernel each way, and 6 dispatched ops
    (the outputs' allocations, the mean, the engine's ``ones_like``)
    where the eager term dispatches 40: 8 in all, under the issue's 16."""
    check_launches_ops_and_syncs(per_pixel, monkeypatch)


@pytest.mark.cuda
@pytest.mark.parametrize('per_pixel', [False, True])
def test_compiled_kernels_on_cuda(per_pixel, monkeypatch):
    """Compiled by Triton: the eager written-out backward on the GPU in
    float32 (its rounding) and float64 (to 1e-10: its ``exp`` and ``log``
    are libdevice's, its divisions and square roots IEEE-rounded, as
    ``test_float64_is_not_approximated_on_a_gpu`` reads in the compiled
    code; the interpreter checks the formula to 1e-12); 2 launches and 6
    ops, no host read; captured in a CUDA graph, a replay on new inputs
    gives their eager gradients."""
    for trainable in (False, True):
        feats, weight, bias = (t.cuda() for t in make_inputs(
            per_pixel, trainable, c=19))
        weight.requires_grad_(trainable)
        got = value_and_grads(STAGLoss(triton=True), feats, weight, bias,
                              tie=True)
        ref = value_and_grads(STAGLoss(analytic_backward=True), feats,
                              weight, bias, tie=True)
        for a, b in zip((got[0], ) + got[1], (ref[0], ) + ref[1]):
            assert rel(a, b) <= 1e-10
    feats, weight, bias = (t.float().cuda().detach()
                           for t in make_inputs(per_pixel, False, c=19))
    got = value_and_grads(STAGLoss(triton=True), feats, weight, bias)
    ref = value_and_grads(STAGLoss(analytic_backward=True), feats, weight,
                          bias)
    for a, b in zip((got[0], ) + got[1], (ref[0], ) + ref[1]):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)
    check_launches_ops_and_syncs(per_pixel, monkeypatch, device='cuda')
    monkeypatch.undo()
    # a graph: the same leaves each call, their gradients dropped first
    h = feats.clone().requires_grad_()
    z = logits_of(feats, weight, bias).requires_grad_()
    loss_fn = STAGLoss(check_finite=False, triton=True)

    def run():
        h.grad = z.grad = None
        loss_fn(h, z, weight, bias).backward()
    graph = capture_graph(run)
    new = feats.flip(0)
    with torch.no_grad():
        h.copy_(new)
        z.copy_(logits_of(new, weight, bias))
    graph.replay()
    torch.cuda.synchronize()
    h_ref = new.clone().requires_grad_()
    z_ref = logits_of(new, weight, bias).requires_grad_()
    STAGLoss(triton=True)(h_ref, z_ref, weight, bias).backward()
    torch.testing.assert_close(h.grad, h_ref.grad, rtol=1e-6, atol=1e-9)
    torch.testing.assert_close(z.grad, z_ref.grad, rtol=1e-6, atol=1e-9)


def test_block_sizes_give_each_multiprocessor_four_programs():
    """``(BLOCK_R, BLOCK_C, BLOCK_D)``: B5 per pixel at 960x540 on an H100
    (132 SMs) in 1013 programs of 32 rows, on an A100 (108) in 507 of 64;
    Cityscapes' full 2048x1024 in 128-row programs; ResNet-50's 64
    samples of 1000 classes a program each; the feature tile 2048."""
    blocks = stag_triton._blocks
    assert blocks(32400, 19, 132) == (32, 32, 64)
    assert blocks(32400, 19, 108) == (64, 32, 32)
    assert blocks(512 * 256, 19, 132) == (128, 32, 16)
    assert blocks(64, 1000, 132) == (1, 1024, 2048)
    assert blocks(6, 5, 1) == (1, 8, 2048)  # the interpreter: 4+ programs
    assert blocks(4096, 5000, 1) == (1, 8192, 2048)


@pytest.fixture(scope='module')
def compiled():
    """tests/triton_aot.py's cases compiled for sm_90 / sm_80, in a process
    of their own without ``TRITON_INTERPRET`` (Triton's own helpers are
    interpreted where it is set)."""
    if not os.path.exists(triton_aot.nvidia_tool('ptxas')):
        pytest.skip("Triton's NVIDIA backend has no ptxas here")
    env = {k: v for k, v in os.environ.items() if k != 'TRITON_INTERPRET'}
    proc = subprocess.run([sys.executable, triton_aot.__file__], env=env,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout)


def test_kernels_compile_for_gpus_without_spilling(compiled):
    """Both kernels of every case through Triton's compiler and ``ptxas``
    (what the interpreter does not run), in registers: none spilled to
    local memory, at most 128 a thread (4 programs of 4 warps an SM)."""
    assert set(compiled) == set(triton_aot.CASES) | set(
        triton_aot.CLASSIFIER_CASES)
    for case, kernels in compiled.items():
        assert set(kernels) == ({'_forward_kernel', '_backward_kernel'}
                                if case in triton_aot.CASES else
                                {'_classify_kernel', '_grad_kernel'}), case
        for kernel, code in kernels.items():
            assert code['local'] == 0 and code['stack'] == 0, (case, kernel)
            assert code['regs'] <= 128, (case, kernel, code['regs'])


def test_the_fused_classifier_on_tensor_cores(compiled):
    """``stag.norm_tap='fused'`` on the B5 (bf16): both GEMMs on tensor
    cores (``mma``/``wgmma`` on bf16), the features' tiles copied to
    shared memory 16 bytes a thread (``cp.async.cg``, pipelined), the
    gradient written 16 bytes a thread, in 507 and 507 x 12 programs.
    float64 on the float64 MMA (``mma...f64``); a ResNet-50's float32 fc
    with TF32 off on no tensor core, in 16-sample tiles: 252 programs
    forward, 512 backward (64-wide tiles would be 16 and 32)."""
    for case in ('b5_bf16_classifier_h100', 'b5_bf16_classifier_a100'):
        for kernel, code in compiled[case].items():
            assert any('bf16' in op for op in code['mma']), (case, kernel)
            assert code['copies'].get('cp.async.cg.shared.global', 0) >= 1
        assert compiled[case]['_classify_kernel']['grid'] == [507, 1, 1]
        assert compiled[case]['_grad_kernel']['grid'] == [507, 12, 1]
        assert compiled[case]['_grad_kernel']['memory'].get(
            'st.global.v4.b32', 0) >= 1, case
    for code in compiled['fp64_classifier_h100'].values():
        assert any(op.endswith('f64.f64.f64.f64') for op in code['mma'])
    resnet = compiled['resnet50_fp32_classifier_h100']
    for code in resnet.values():
        assert not code['mma']
    assert resnet['_classify_kernel']['grid'] == [4, 63, 1]
    assert resnet['_grad_kernel']['grid'] == [4, 128, 1]


def test_b5_features_move_16_bytes_a_thread(compiled):
    """The B5's bf16 features, contiguous along the pixels, read and
    written as 16-byte vectors (``ld/st.global.v4.b32``: 8 values) where
    the kernels stream them; the logits and coefficients are ~4 % of the
    bytes and have no such loads here."""
    for case in ('b5_bf16_h100', 'b5_bf16_a100'):
        code = compiled[case]
        assert code['_forward_kernel']['grid'] == \
            [1013 if case.endswith('h100') else 507]
        assert code['_forward_kernel']['memory'].get(
            'ld.global.v4.b32', 0) >= 1, case
        assert code['_backward_kernel']['memory'].get(
            'st.global.v4.b32', 0) >= 1, case


def test_float64_is_not_approximated_on_a_gpu(compiled):
    """In float64 ``exp`` and ``log`` are libdevice's (``__nv_exp``,
    ``__nv_log``; their reciprocal estimate refined), the divisions and
    square roots IEEE-rounded: no float32 approximation (float32 uses
    ``ex2.approx.f32`` and ``div.full.f32``, as torch's own kernels)."""
    for kernel, code in compiled['fp64_trained_h100'].items():
        math = code['math']
        assert {'__nv_exp', '__nv_log'} <= set(math), (kernel, math)
        assert not [op for op in math if op.endswith('f32')
                    or op.startswith(('ex2', 'lg2'))], (kernel, math)
    forward = compiled['fp64_trained_h100']['_forward_kernel']['math']
    assert 'div.rn.f64' in forward and 'sqrt.rn.f64' in forward


def test_past_32_bit_offsets_is_refused():
    """Shapes and strides only: meta tensors, no memory."""
    huge = torch.empty(2**29, 2, 2, device='meta').transpose(0, 2)
    assert huge.shape == (2, 2, 2**29)
    stag_triton._check_size(huge[:, :1], torch.empty(1, 5, 1), 1)
    with pytest.raises(ValueError, match='features span 2147483648'):
        stag_triton._check_size(huge, torch.empty(1, 5, 1), 1)
    with pytest.raises(ValueError, match='coefficients of each of the rows'):
        stag_triton._check_size(torch.empty(1, 1, 1), torch.empty(1, 2, 1),
                                2**29)


@interpreted
def test_bad_options_and_devices_are_refused(monkeypatch):
    with pytest.raises(ValueError, match='exclude each other'):
        STAGLoss(compile=True, triton=True)
    with pytest.raises(ValueError, match='triton=True needs the analytic'):
        STAGLoss(triton=True, analytic_backward=False)
    with pytest.raises(ValueError, match="label='hard'"):
        STAGLoss(triton=True, label='soft')
    feats, weight, bias = make_inputs(True, False)
    monkeypatch.delenv('TRITON_INTERPRET')
    with pytest.raises(ValueError, match='runs on CUDA tensors, got a cpu'):
        STAGLoss(triton=True)(feats, logits_of(feats, weight, bias), weight,
                              bias)
    import importlib.util
    monkeypatch.setattr(importlib.util, 'find_spec', lambda name: None)
    with pytest.raises(ImportError, match='needs the triton package'):
        STAGLoss(triton=True)
    with pytest.raises(ValueError, match='kernels must be one of'):
        stag.alignment_kernels('cuda')
