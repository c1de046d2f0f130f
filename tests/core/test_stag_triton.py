"""``STAGLoss(triton=True)``: the hard-label term as two Triton kernels, run
here by Triton's interpreter (``TRITON_INTERPRET=1``, NumPy on the CPU;
tests/cuda runs them compiled on a GPU). Equal to the eager written-out
backward in float64 for every anchor mode, a frozen, trainable or
bias-only classifier, per sample and per pixel; two launches and a few
dispatched ops per forward and backward, no host read."""
import pytest
import torch
from torch.utils._python_dispatch import _disable_current_modes

from host_syncs import HostSyncCounter, count_dispatched_ops
from mmseg_stag.analysis.step_benchmark import capture_graph
from mmseg_stag.core import STAGLoss, stag
from test_stag_analytic import (logits_of, make_inputs, one_step, rel,
                                value_and_grads)

pytest.importorskip('triton')
from mmseg_stag.core import stag_triton  # noqa: E402

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
    """``(kernel launches, dispatched ops)`` of ``step()``: the ops the
    interpreter dispatches to run a kernel on the CPU are not counted."""
    launches = []
    kernel = stag_triton._kernel

    class Counted:
        def __init__(self, fn):
            self.fn = fn

        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                launches.append(self.fn.__name__)
                with _disable_current_modes():
                    kernel(self.fn)[grid](*args, **kwargs)
            return launch
    monkeypatch.setattr(stag_triton, '_kernel', Counted)
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
    float32 (its rounding) and float64 (to 1e-5: Triton may evaluate
    ``exp`` and ``log`` of float64 at float32's precision there; the
    interpreter checks the formula to 1e-12); 2 launches and 6 ops, no
    host read; captured in a CUDA graph, a replay on new inputs gives
    their eager gradients."""
    for trainable in (False, True):
        feats, weight, bias = (t.cuda() for t in make_inputs(
            per_pixel, trainable, c=19))
        weight.requires_grad_(trainable)
        got = value_and_grads(STAGLoss(triton=True), feats, weight, bias,
                              tie=True)
        ref = value_and_grads(STAGLoss(analytic_backward=True), feats,
                              weight, bias, tie=True)
        for a, b in zip((got[0], ) + got[1], (ref[0], ) + ref[1]):
            assert rel(a, b) <= 1e-5
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
