"""``||h||`` tapped beside the classifier (``stag.tap_feature_norm``,
``STAGLoss(..., feature_norm=...)``, a method's ``stag.norm_tap``): the
same loss and gradients as the term reading ``h`` itself, in float64, for
each implementation of the term; the features' gradient in one D-sized
pass where the term otherwise adds a second and autograd a third."""
import pytest
import torch
import torch.nn as nn
from torch.utils._python_dispatch import TorchDispatchMode

from mmseg_stag.core import HeadProbe, STAGLoss, stag
from test_stag_analytic import logits_of, make_inputs, rel

TERMS = {'autograd': dict(analytic_backward=False),
         'written out': dict(analytic_backward=True),
         'triton': dict(triton=True)}


def needs(term):
    if term != 'triton':
        return
    pytest.importorskip('triton')
    from mmseg_stag.core import stag_triton
    if not stag_triton.interpreting():
        pytest.skip('TRITON_INTERPRET is not 1 (tests/cuda: compiled)')


def step(options, per_pixel, trainable, tap, anchor):
    """TENT's entropy and the STAG term on one pass; ``(loss, dL/dh,
    dL/dz, dL/dW)``, ``h`` a leaf before the classifier (and the tap)."""
    feats, weight, bias = make_inputs(per_pixel, trainable, c=19)
    leaf = feats.clone().requires_grad_()
    h, norm = stag.tap_feature_norm(leaf) if tap else (leaf, None)
    z = logits_of(h, weight, bias)
    z.retain_grad()
    term = STAGLoss(anchor=anchor, **options)(h, z, weight, bias,
                                              feature_norm=norm)
    entropy = -(z.softmax(1) * z.log_softmax(1)).sum(1).mean()
    (entropy + 3.0 * term).backward()
    return term.detach(), leaf.grad, z.grad, weight.grad


@pytest.mark.parametrize('term', list(TERMS))
@pytest.mark.parametrize('per_pixel', [False, True])
@pytest.mark.parametrize('trainable', [False, True])
@pytest.mark.parametrize('anchor', ['diagonal', 'full'])
def test_the_tap_gives_the_terms_value_and_gradients(term, per_pixel,
                                                     trainable, anchor):
    """Every anchor mode, a frozen and a trainable classifier (whose
    projections from the features still reach ``h`` through the term),
    a zero feature vector and a tie (make_inputs): float64 to 1e-12."""
    needs(term)
    ref = step(TERMS[term], per_pixel, trainable, False, anchor)
    got = step(TERMS[term], per_pixel, trainable, True, anchor)
    for a, b in zip(got, ref):
        if b is None:
            assert a is None
        else:
            assert rel(a, b) <= 1e-12
    assert torch.isfinite(got[1]).all()


class FeatureSized(TorchDispatchMode):
    """The dispatched ops whose output has ``numel`` elements: on a GPU,
    each writes the features' size once (allocations aside)."""

    def __init__(self, numel):
        super().__init__()
        self.numel, self.ops = numel, []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func.overloadpacket.__name__
        if not func.is_view and torch.is_tensor(out) and \
                out.numel() == self.numel and 'empty' not in name:
            self.ops.append(name)
        return out


@pytest.mark.parametrize('term', ['written out', 'triton'])
def test_the_features_gradient_is_written_once_beside_the_classifiers(
        term, monkeypatch):
    """Backward of the classifier and the term, per pixel: without the
    tap the classifier writes ``dL/dh``, the term a second D-sized
    tensor ``c h`` and autograd their sum (3 writes); with it the
    classifier's and one ``addcmul`` (2). The Triton backward's output
    is read from its launch (the interpreter's own copies not counted)."""
    needs(term)
    feats, weight, bias = make_inputs(True, False, c=19, d=16)
    feats = feats.float()
    weight, bias = weight.float(), bias.float()
    loss_fn = STAGLoss(check_finite=False, **TERMS[term])
    kernel_outputs = []
    if term == 'triton':
        from host_syncs import watch_launches

        def seen(fn, args):
            if fn.__name__ == '_backward_kernel':
                kernel_outputs.append(args[6].numel())  # gh_ptr
        watch_launches(monkeypatch, seen)
    writes = {}
    for tap in (False, True):
        leaf = feats.clone().requires_grad_()
        h, norm = stag.tap_feature_norm(leaf) if tap else (leaf, None)
        z = logits_of(h, weight, bias)
        loss = loss_fn(h, z, weight, bias, feature_norm=norm) + \
            z.logsumexp(1).mean()
        counter = FeatureSized(feats.numel())
        with counter:
            loss.backward()
        writes[tap] = counter.ops
    if term == 'triton':
        # the kernel writes c h, D-sized; tapped, dL/d||h|| a pixel
        assert kernel_outputs == [feats.numel(), feats.numel() // 16]
        writes[False].append('the kernel')
    assert len(writes[False]) == 3, writes
    assert len(writes[True]) == 2 and writes[True][-1] == 'addcmul', writes


class TwoCalls(nn.Module):
    """A classifier called twice per pass (sliding windows)."""

    def __init__(self):
        super().__init__()
        self.backbone = nn.Conv2d(3, 6, 1)
        self.head = nn.Conv2d(6, 4, 1)

    def forward(self, x):
        h = self.backbone(x)
        return torch.cat([self.head(h[..., :2]), self.head(h[..., 2:])], -1)


def test_the_probe_taps_each_call_where_gradients_are_on():
    model = TwoCalls()
    probe = HeadProbe('head', 'per_pixel')
    x = torch.randn(2, 3, 5, 4)
    rec = probe.record(model, x, tap_norms=True)
    assert len(rec.feature_norms) == len(rec.head_outputs) == 2
    for (features, logits), norm in zip(rec.head_outputs, rec.feature_norms):
        # the classifier read the tap's features
        assert type(features.grad_fn).__name__ == 'FeatureNormTapBackward'
        torch.testing.assert_close(
            norm, torch.linalg.vector_norm(features, dim=1, keepdim=True))
        torch.testing.assert_close(logits, model.head(features))
    untapped = probe.record(model, x)
    assert untapped.feature_norms is None
    torch.testing.assert_close(untapped.prediction, rec.prediction)
    assert probe(model, x)[1][0][0].grad_fn is not None  # (pred, outputs)
    with torch.no_grad():
        assert probe.record(model, x, tap_norms=True).feature_norms is None


def test_a_feature_norm_of_the_wrong_shape_is_refused():
    feats, weight, bias = make_inputs(True, False)
    z = logits_of(feats, weight, bias)
    with pytest.raises(ValueError, match=r'feature_norm must have shape '
                       r'\(3, 1, 2, 3\)'):
        STAGLoss()(feats, z, weight, bias,
                   feature_norm=feats.norm(dim=1))
    with pytest.raises(ValueError, match='2 feature norms for 1 classifier'):
        STAGLoss().over_outputs([(feats, z)], weight, bias,
                                feature_norms=[feats, feats])
