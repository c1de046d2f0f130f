"""The hard-label STAG term through ``HardAlignment``'s written-out backward:
the value and the gradients of autograd through ``stag_alignment`` (the
reference), in float64, for every anchor mode, a frozen or trainable
classifier, per sample and per pixel; few dispatched ops and no host read
(tests/host_syncs.py for what is counted)."""
import pytest
import torch

from host_syncs import HostSyncCounter, count_dispatched_ops
from mmseg_stag.core import STAGLoss, stag

DTYPE = torch.float64


def make_inputs(per_pixel, trainable, seed=0, n=3, d=7, c=5):
    """Features, logits of a 1x1 classifier on them, ``W`` and ``b``; one
    all-zero feature vector and one tie between the two largest logits."""
    gen = torch.Generator().manual_seed(seed)
    weight = torch.randn(c, d, generator=gen, dtype=DTYPE)
    bias = torch.randn(c, generator=gen, dtype=DTYPE)
    shape = (n, d, 2, 3) if per_pixel else (n * 2, d)
    feats = torch.randn(shape, generator=gen, dtype=DTYPE)
    feats[1, :] = 0  # ||h|| = 0: the norm's gradient is 0 there
    weight.requires_grad_(trainable)
    return feats, weight, bias


def logits_of(feats, weight, bias):
    if feats.dim() == 2:
        return feats @ weight.t() + bias
    # contiguous, as a 1x1 conv's output
    return (torch.einsum('ndhw,cd->nchw', feats, weight) +
            bias.view(1, -1, 1, 1)).contiguous()


def value_and_grads(loss_fn, feats, weight, bias, tie=False):
    """The loss and its gradients w.r.t. the features and the logits (and
    ``W`` when trainable), each input a fresh leaf."""
    h = feats.clone().requires_grad_()
    z = logits_of(h, weight, bias)
    if tie:  # the two largest classes equal at the first sample (pixel)
        z = z.clone()
        first = z[(0, slice(None)) + (0, ) * (z.dim() - 2)]  # a view
        top = first.detach().topk(2).indices
        first[top[1]] = first[top[0]].detach()
    z.retain_grad()
    value = loss_fn(h, z, weight, bias)
    inputs = [h] + ([weight] if weight.requires_grad else [])
    grads = torch.autograd.grad(value, inputs + [z], retain_graph=True)
    return value.detach(), grads


def rel(a, b):
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-300))


@pytest.mark.parametrize('per_pixel', [False, True])
@pytest.mark.parametrize('trainable', [False, True])
@pytest.mark.parametrize('anchor', ['diagonal', 'full'])
@pytest.mark.parametrize('eps', [1e-8, 0.1])
def test_analytic_equals_autograd_in_float64(per_pixel, trainable, anchor,
                                             eps):
    feats, weight, bias = make_inputs(per_pixel, trainable)
    got = value_and_grads(STAGLoss(eps=eps, anchor=anchor,
                                   analytic_backward=True),
                          feats, weight, bias, tie=True)
    ref = value_and_grads(STAGLoss(eps=eps, anchor=anchor,
                                   analytic_backward=False),
                          feats, weight, bias, tie=True)
    assert rel(got[0], ref[0]) <= 1e-12
    assert rel(got[1][0], ref[1][0]) <= 1e-12  # h: through ||h||, P and z
    # z (and W through z): with a trainable W, P comes from h and dL/dz is
    # the path through s alone, of size eps/D^2. Autograd forms it as
    # P/D - |s| n alpha P/D^2, whose cancellation leaves ~1e-10 of relative
    # rounding at eps = 1e-8; the written-out P eps/D^2 has none
    tol = 1e-8 if trainable and eps < 1e-3 else 1e-12
    for a, b in zip(got[1][1:], ref[1][1:]):
        assert rel(a, b) <= tol
    assert got[1][0].abs().max() > 0


def test_label_is_argmax_first_on_ties():
    feats, weight, bias = make_inputs(True, False)
    loss = STAGLoss()
    h = feats.clone()
    z = logits_of(h, weight, bias)
    z[0, :, 0, 0] = 0
    z[0, 1, 0, 0] = z[0, 3, 0, 0] = 2.0  # classes 1 and 3 tie
    table, eps, eps_t, matrix, on_features = loss._hard_alignment_inputs(
        weight, bias, DTYPE, DTYPE)
    value = stag.hard_alignment(h, z, table, eps, eps_t, matrix, on_features)
    ref = stag.stag_alignment(
        h, z, loss.anchors(weight, bias),
        projections=stag.projections_from_logits(
            z, loss.anchor_coefficients(weight, bias), bias)).mean()
    assert rel(value, ref) <= 1e-12


def one_step(loss_fn, per_pixel, trainable=False, device='cpu'):
    """Forward and backward of the term, anchors cached, float32."""
    feats, weight, bias = make_inputs(per_pixel, trainable)
    feats, weight, bias = (t.detach().float().to(device)
                           for t in (feats, weight, bias))
    weight.requires_grad_(trainable)
    z = logits_of(feats, weight, bias).detach().requires_grad_()
    h = feats.requires_grad_()
    loss_fn(h, z, weight, bias)  # the anchors, once

    def run():
        loss_fn(h, z, weight, bias).backward()
    return run


@pytest.mark.parametrize('per_pixel', [False, True])
def test_few_dispatched_ops_and_no_host_read(per_pixel):
    """A step of the term dispatches 40 ops (forward 32, backward 7, the
    engine's ones_like): autograd through the same formula needs over 60,
    each a kernel on a GPU and most an autograd node too. (Fewer than 40
    in PyTorch ops is not in reach: 8 are C- or D-sized reductions and
    gathers, 4 write the gradients, and the per-sample chain of
    eq:sample_sensitivity and eq:stag_loss with its derivative is ~27
    elementwise ops deep; ``compile=True`` fuses that chain, ``triton=True``
    runs it in two kernels: tests/core/test_stag_triton.py.)"""
    loss = STAGLoss(check_finite=False, analytic_backward=True)
    ops = count_dispatched_ops(one_step(loss, per_pixel))
    assert len(ops) <= 40, ops
    reference = count_dispatched_ops(one_step(
        STAGLoss(check_finite=False, analytic_backward=False), per_pixel))
    assert len(reference) > 60
    counter = HostSyncCounter()
    with counter:
        one_step(loss, per_pixel)()
    assert counter.calls == []


def test_trainable_classifier_recomputes_its_inputs_once_per_update():
    loss = STAGLoss(check_finite=False, analytic_backward=True)
    fc = torch.nn.Linear(4, 3)
    optim = torch.optim.SGD(fc.parameters(), lr=0.1)
    feats = torch.randn(5, 4)
    for _ in range(3):
        optim.zero_grad()
        loss(feats, fc(feats), fc.weight, fc.bias).backward()
        table, _, _, matrix, on_features = loss._hard_inputs
        assert on_features and matrix.shape == (3, 4)
        torch.testing.assert_close(
            matrix, stag.structural_anchors(fc.weight.detach(),
                                            fc.bias.detach()))
        optim.step()
    assert loss.anchor_computations == 3


@pytest.mark.parametrize('trainable', [False, True])
def test_compiled_term_equals_eager(trainable):
    """``compile=True`` (the forward and backward math each through
    ``torch.compile``): in float64 the eager term's value and gradients to
    1e-12 (frozen classifier: projections from the logits; trainable: from
    the features), in float32 to the fused kernels' rounding."""
    feats, weight, bias = make_inputs(True, trainable)
    got = value_and_grads(STAGLoss(compile=True), feats, weight, bias,
                          tie=True)
    ref = value_and_grads(STAGLoss(analytic_backward=True), feats, weight,
                          bias, tie=True)
    assert rel(got[0], ref[0]) <= 1e-12
    for a, b in zip(got[1], ref[1]):
        assert rel(a, b) <= 1e-12
    feats, weight, bias = feats.float(), weight.detach().float(), \
        bias.float()
    weight.requires_grad_(trainable)
    got = value_and_grads(STAGLoss(compile=True), feats, weight, bias)
    ref = value_and_grads(STAGLoss(analytic_backward=True), feats, weight,
                          bias)
    torch.testing.assert_close(got[0], ref[0])
    for a, b in zip(got[1], ref[1]):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)
    with pytest.raises(ValueError, match='analytic backward'):
        STAGLoss(compile=True, analytic_backward=False)


def test_default_is_analytic_on_a_gpu_only():
    """``analytic_backward=None``: autograd on the CPU (the demos' float32
    numbers to the last digit), the written-out backward on CUDA (tests/
    cuda); the same value either way."""
    feats, weight, bias = make_inputs(True, False)
    loss = STAGLoss()
    assert loss.analytic_backward is None
    ops = count_dispatched_ops(one_step(loss, True))
    assert len(ops) > 60  # autograd's
    value, _ = value_and_grads(loss, feats, weight, bias)
    ref, _ = value_and_grads(STAGLoss(analytic_backward=True), feats,
                             weight, bias)
    assert rel(value, ref) <= 1e-12


@pytest.mark.cuda
@pytest.mark.parametrize('per_pixel', [False, True])
def test_default_on_cuda_is_the_analytic_backward(per_pixel):
    """On a GPU the default runs ``HardAlignment`` (40 ops), equal to
    autograd on the GPU in float64, with no host read."""
    feats, weight, bias = (t.cuda() for t in make_inputs(per_pixel, False))
    got = value_and_grads(STAGLoss(), feats, weight, bias, tie=True)
    ref = value_and_grads(STAGLoss(analytic_backward=False), feats, weight,
                          bias, tie=True)
    for a, b in zip((got[0], ) + got[1], (ref[0], ) + ref[1]):
        assert rel(a, b) <= 1e-12
    # the classifier's tensors themselves each call: the anchors cached
    step = one_step(STAGLoss(check_finite=False), per_pixel, device='cuda')
    counter = HostSyncCounter()
    with counter:
        ops = count_dispatched_ops(step)
    assert len(ops) <= 40, ops
    assert counter.calls == []
