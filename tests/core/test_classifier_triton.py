"""``stag.norm_tap='fused'``: the classifier as a Triton GEMM that returns
``||h||`` beside the logits and adds the term's ``dL/d||h||`` to ``dL/dh``
in its backward (mmseg_stag/core/classifier_triton.py), run here by
Triton's interpreter; tests/core/test_stag_triton.py compiles its kernels
for sm_90/sm_80, the tests marked cuda run them on a GPU. Compared with
the module itself and :func:`~mmseg_stag.core.stag.tap_feature_norm`
(``norm_tap=True``): values and the gradients of ``h``, ``W`` and ``b``."""
import pytest
import torch
from torch import nn

from host_syncs import HostSyncCounter, count_dispatched_ops, watch_launches
from mmseg_stag.core import HeadProbe
from mmseg_stag.core.methods import TENT
from mmseg_stag.core.stag import tap_feature_norm

pytest.importorskip('triton')
from mmseg_stag.core import classifier_triton, stag_triton  # noqa: E402
from reference.adaptation_testbed import CNN_ADAPTER, make_cnn  # noqa
from test_norm_tap import TwoCalls  # noqa: E402

interpreted = pytest.mark.skipif(
    not stag_triton.interpreting(), reason='TRITON_INTERPRET is not 1')


def fused(module, features):
    return classifier_triton.classify_with_norm(module, features)


def tapped(module, features):
    h, norm = tap_feature_norm(features)
    return module(h), norm


def outputs_and_grads(run, module, features, grad_z, grad_n):
    """``(z, ||h||, [dh, dW, db])`` of ``run`` for the cotangents
    ``grad_z`` and ``grad_n`` (either None: that output unused)."""
    features = features.detach().requires_grad_()
    z, norm = run(module, features)
    outs = [(z, grad_z), (norm, grad_n)]
    outs = [(o, g) for o, g in outs if g is not None]
    wrt = [features] + [p for p in module.parameters() if p.requires_grad]
    grads = torch.autograd.grad([o for o, _ in outs], wrt,
                                [g.to(o.dtype) for o, g in outs],
                                materialize_grads=True)
    return z.detach(), norm.detach(), grads


def rel(a, b):
    return float((a.double() - b.double()).abs().max() /
                 b.double().abs().max().clamp_min(1e-300))


def layouts(features):
    """The features as given, channels-last and a strided slice."""
    yield features
    if features.dim() == 4:
        yield features.contiguous(memory_format=torch.channels_last)
        wide = torch.cat([features, features], -1)
        yield wide[..., ::2]


def modules(dtype):
    torch.manual_seed(0)
    yield nn.Conv2d(24, 19, 1), (2, 24, 5, 7)
    yield nn.Conv2d(24, 5, 1, bias=False), (1, 24, 3, 4)
    yield nn.Linear(24, 19), (6, 24)
    yield nn.Linear(24, 100), (3, 24)  # classes in 2 tiles


@interpreted
@pytest.mark.parametrize('trainable', [False, True])
def test_float64_equals_the_module_and_the_tap(trainable):
    """Values and gradients (``h``, and ``W``, ``b`` when trained) to
    1e-12, in every layout, with a zero feature vector (its norm's
    gradient 0, as the tap's) and either output alone."""
    for module, shape in modules(torch.float64):
        module = module.double().requires_grad_(trainable)
        features = torch.randn(shape, dtype=torch.float64)
        if features.dim() == 2:
            features[0] = 0.0
        else:
            features[0, :, 1, 2] = 0.0
        for h in layouts(features):
            z = module(h)
            grad_z = torch.randn_like(z)
            grad_n = torch.randn_like(
                torch.linalg.vector_norm(h, dim=1, keepdim=True))
            for gz, gn in ((grad_z, grad_n), (grad_z, None), (None, grad_n)):
                got = outputs_and_grads(fused, module, h, gz, gn)
                want = outputs_and_grads(tapped, module, h, gz, gn)
                assert got[0].shape == want[0].shape
                assert got[0].stride() == want[0].contiguous().stride()
                assert got[1].shape == want[1].shape
                for a, b in zip(got[:2] + got[2], want[:2] + want[2]):
                    assert rel(a, b) <= 1e-12, (module, h.stride())


@interpreted
def test_float32_and_bfloat16_autocast():
    """float32: to its rounding. Under bf16 autocast, as ``F.conv2d``
    there: the logits in bf16 (the GEMM in bf16, accumulated in float32),
    ``||h||`` in float32 of the features as given (bf16 or float32, not
    of their bf16 cast), ``dL/dh`` in the features' dtype."""
    torch.manual_seed(0)
    module = nn.Conv2d(40, 19, 1)
    features = torch.randn(2, 40, 5, 7)
    grad_z = torch.randn(2, 19, 5, 7)
    grad_n = torch.randn(2, 1, 5, 7)
    got = outputs_and_grads(fused, module, features, grad_z, grad_n)
    want = outputs_and_grads(tapped, module, features, grad_z, grad_n)
    for a, b in zip(got[:2] + got[2], want[:2] + want[2]):
        assert rel(a, b) <= 1e-6
    for dtype in (torch.bfloat16, torch.float32):
        h = features.to(dtype)
        with torch.autocast('cpu', dtype=torch.bfloat16):
            got = outputs_and_grads(fused, module, h, grad_z, grad_n)
            want = outputs_and_grads(tapped, module, h, grad_z, grad_n)
        assert got[0].dtype == want[0].dtype == torch.bfloat16
        assert got[1].dtype == torch.float32
        torch.testing.assert_close(got[1], want[1])
        assert rel(got[0], want[0]) < 1e-2  # a bf16 rounding or two
        assert got[2][0].dtype == dtype
        for a, b in zip(got[2], want[2]):
            assert rel(a, b) < 1e-2


@interpreted
def test_one_launch_each_way_few_ops_no_host_read(monkeypatch):
    """Forward and backward of the B5-like frozen classifier: a kernel
    each, beside the outputs' allocations; no host read."""
    module = nn.Conv2d(24, 19, 1).requires_grad_(False)
    features = torch.randn(1, 24, 6, 8, requires_grad=True)

    def step():
        z, norm = fused(module, features)
        torch.autograd.backward([z, norm], [torch.ones_like(z),
                                            torch.ones_like(norm)])
    launches = []
    watch_launches(monkeypatch, lambda fn, args: launches.append(
        fn.__name__), classifier_triton)
    ops = count_dispatched_ops(step)
    assert launches == ['_classify_kernel', '_grad_kernel']
    assert len(ops) <= 12, ops
    counter = HostSyncCounter()
    with counter:
        step()
    assert counter.calls == []


@interpreted
def test_the_probe_runs_it_for_each_call_and_restores_the_module():
    model = TwoCalls()
    probe = HeadProbe('head', 'per_pixel')
    x = torch.randn(2, 3, 5, 4)
    rec = probe.record(model, x, tap_norms='fused')
    ref = probe.record(model, x, tap_norms=True)
    assert len(rec.feature_norms) == len(rec.head_outputs) == 2
    assert 'forward' not in vars(model.head)
    torch.testing.assert_close(rec.prediction, ref.prediction)
    for (h, z), norm, (_, z_ref), norm_ref in zip(
            rec.head_outputs, rec.feature_norms, ref.head_outputs,
            ref.feature_norms):
        assert type(z.grad_fn).__name__ == 'ViewBackward0'
        torch.testing.assert_close(z, z_ref)
        torch.testing.assert_close(norm, norm_ref)
    with torch.no_grad():  # nothing to tap: the module's own forward
        assert probe.record(model, x, tap_norms='fused').feature_norms is None

    class Fails(TwoCalls):
        def forward(self, x):
            self.head(self.backbone(x))
            raise RuntimeError('inside the model')
    failing = Fails()
    with pytest.raises(RuntimeError, match='inside the model'):
        probe.record(failing, x, tap_norms='fused')
    assert 'forward' not in vars(failing.head)


def test_bad_classifiers_options_and_devices_are_refused(monkeypatch):
    check = classifier_triton.check_fused_classifier
    check(nn.Linear(3, 2))
    check(nn.Conv2d(3, 2, 1))
    check(nn.Conv2d(3, 2, 1, padding='same', dilation=2))
    for module in (nn.Conv2d(3, 2, 3), nn.Conv2d(4, 2, 1, groups=2),
                   nn.Conv2d(3, 2, 1, stride=2), nn.Conv2d(3, 2, 1, padding=1),
                   nn.Sequential()):
        with pytest.raises(ValueError, match="'head'.*norm_tap=True"):
            check(module, 'head')
    with pytest.raises(ValueError, match='stag.norm_tap must be one of'):
        HeadProbe('head', 'per_pixel').record(TwoCalls(), None,
                                              tap_norms='yes')
    if stag_triton.interpreting():
        with pytest.raises(ValueError, match='float64 got torch.float32 '
                           'features outside autocast'):
            fused(nn.Linear(3, 2).double(), torch.randn(4, 3))
        with pytest.raises(ValueError, match='Conv2d classifier got '
                           r'features of shape \(4, 3\)'):
            fused(nn.Conv2d(3, 2, 1), torch.randn(4, 3))
    monkeypatch.setenv('TRITON_INTERPRET', '0')
    with pytest.raises(ValueError, match='runs on CUDA tensors, got a cpu'):
        fused(nn.Linear(3, 2), torch.randn(4, 3))
    # a method refuses it when configured, before any batch
    stag = dict(beta0=1.0, gamma=1.0, norm_tap='fused')
    method = TENT(stag=stag)
    with pytest.raises(ValueError, match='runs on CUDA tensors'):
        method.configure(make_cnn(), CNN_ADAPTER)
    with pytest.raises(ValueError, match='norm_tap must be one of'):
        TENT(stag=dict(stag, norm_tap='on'))
    import importlib.util
    monkeypatch.setattr(importlib.util, 'find_spec', lambda name: None)
    with pytest.raises(ImportError, match="norm_tap='fused' needs the "
                       'triton package'):
        TENT(stag=stag)


def test_tiles_narrow_until_each_multiprocessor_has_two_programs():
    """``((BLOCK_M, BLOCK_C), (BLOCK_M, BLOCK_D))``: the B5 at 960x540
    keeps 64-wide tiles on an H100 (132 SMs) and an A100 (108); a
    ResNet-50's fc at batch 64 narrows to 16; a batch of 2 counts twice;
    never under 16 (``tl.dot``'s least)."""
    blocks = classifier_triton._blocks
    assert blocks(1, 32400, 19, 768, 132) == ((64, 32), (64, 64))
    assert blocks(1, 32400, 19, 768, 108) == ((64, 32), (64, 64))
    assert blocks(1, 64, 1000, 2048, 132) == ((16, 16), (16, 16))
    assert blocks(2, 35, 19, 24, 1) == ((64, 32), (64, 64))
    assert blocks(1, 6, 5, 24, 1) == ((16, 16), (16, 16))
    assert blocks(1, 128, 19, 64, 4) == ((16, 32), (16, 64))


def test_past_32_bit_offsets_is_refused():
    huge = torch.empty(2**29, 2, 2, device='meta').transpose(0, 2)
    with pytest.raises(ValueError, match="classifier's features .* span "
                       '2147483648'):
        classifier_triton._check_size(huge, torch.empty(2, 19, 4))


@pytest.mark.cuda
def test_on_cuda_equal_to_the_module_and_the_tap():
    """Compiled: float64 to 1e-10 (the GEMM's sums in another order),
    float32 with TF32 off to its rounding, bf16 autocast to a bf16
    rounding; a frozen and a trained classifier."""
    for module, shape in modules(torch.float64):
        for trainable in (False, True):
            module = module.double().cuda().requires_grad_(trainable)
            h = torch.randn(shape, dtype=torch.float64, device='cuda')
            z = module(h)
            grad_z, grad_n = torch.randn_like(z), torch.randn_like(
                torch.linalg.vector_norm(h, dim=1, keepdim=True))
            got = outputs_and_grads(fused, module, h, grad_z, grad_n)
            want = outputs_and_grads(tapped, module, h, grad_z, grad_n)
            for a, b in zip(got[:2] + got[2], want[:2] + want[2]):
                assert rel(a, b) <= 1e-10
            module.float()
            h, grad_z, grad_n = h.float(), grad_z.float(), grad_n.float()
            tf32 = torch.backends.cudnn.allow_tf32, \
                torch.backends.cuda.matmul.allow_tf32
            torch.backends.cudnn.allow_tf32 = False
            torch.backends.cuda.matmul.allow_tf32 = False
            try:
                got = outputs_and_grads(fused, module, h, grad_z, grad_n)
                want = outputs_and_grads(tapped, module, h, grad_z, grad_n)
            finally:
                torch.backends.cudnn.allow_tf32, \
                    torch.backends.cuda.matmul.allow_tf32 = tf32
            for a, b in zip(got[:2] + got[2], want[:2] + want[2]):
                torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
            with torch.autocast('cuda', dtype=torch.bfloat16):
                got = outputs_and_grads(fused, module, h.bfloat16(), grad_z,
                                        grad_n)
                want = outputs_and_grads(tapped, module, h.bfloat16(),
                                         grad_z, grad_n)
            assert got[0].dtype == torch.bfloat16
            for a, b in zip(got[:2] + got[2], want[:2] + want[2]):
                assert rel(a, b) < 1e-2
