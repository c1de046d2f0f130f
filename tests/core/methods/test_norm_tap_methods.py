"""``stag.norm_tap=True`` and ``'fused'`` in every method with STAG
(test_method_state's configurations): each forward pass the method
computes STAG on is tapped (a pass that is not raises), and the stream's
predictions and parameters equal those without the tap to float32
rounding; what STAG adds to a TENT step, in dispatched ops."""
import collections

import pytest
import torch
from reference.adaptation_testbed import adapt
from test_method_state import BATCHES, METHODS, start

from host_syncs import count_dispatched_ops
from mmseg_stag.core import Batch


def run(cfg, batches):
    torch.manual_seed(0)  # CoTTA's augmentations and restores
    method = start(cfg)
    predictions = []
    for i, x in enumerate(batches):
        method.start_stage(i // 2)
        predictions.append(adapt(method, x)[0])
    return method, predictions


def interpreting():
    from mmseg_stag.core import stag_triton
    return stag_triton.interpreting()


@pytest.mark.parametrize('name', list(METHODS))
@pytest.mark.parametrize('tap', [True, 'fused'])
def test_every_method_takes_the_tap_with_the_same_updates(name, tap):
    """``'fused'``: the classifier run by the Triton kernels (here
    interpreted, in the testbed's float64: equal to ~1e-15)."""
    if tap == 'fused':
        pytest.importorskip('triton')
        if not interpreting():
            pytest.skip('TRITON_INTERPRET is not 1')
    cfg = METHODS[name]
    plain, want = run(cfg, BATCHES[:4])
    tapped_cfg = dict(cfg, stag=dict(cfg['stag'], norm_tap=tap))
    tapped, got = run(tapped_cfg, BATCHES[:4])
    assert tapped.norm_tap == tapped.adapter.tap_norms == tap
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    for p, q in zip(tapped.model.parameters(), plain.model.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)


def test_an_untapped_pass_is_refused():
    method = start(METHODS['tent+stag'] | dict(
        stag=dict(METHODS['tent+stag']['stag'], norm_tap=True)))
    fwd = method.adapter.forward(method.model, Batch(BATCHES[0]))
    assert fwd.feature_norms is not None
    fwd.feature_norms = None
    with pytest.raises(RuntimeError, match='did not tap'):
        method.loss(Batch(BATCHES[0]), fwd)


#: what only allocates (no kernel on a GPU)
ALLOCATIONS = {'empty', 'new_empty', 'empty_like'}


def tent_after_one_step(stag, x):
    """TENT (+``stag``) with SGD on test_base_method's per-pixel model,
    after one step on ``x`` (the anchors cached): its next step is the one
    a test counts."""
    from mmseg_stag.core.methods import TENT
    from test_base_method import ADAPTER, make_model
    method = TENT(stag=stag, optimizer=dict(type='SGD', lr=1e-3))
    method.configure(make_model(), ADAPTER)
    method.adapt(Batch(x))
    return method


def test_what_stag_adds_to_a_tent_step(monkeypatch):
    """The CPU proxy of STAG's in-step cost on a GPU: the ops a TENT+STAG
    step dispatches beyond TENT's (test_base_method's per-pixel model,
    SGD). The default's written-out term adds over 40; with its Triton
    kernels and the fused classifier (``norm_tap='fused'``) 2 launches
    and at most 6 computing ops (``beta L_STAG``, its mean, the sum into
    the logits' gradient), the classifier's convolution and its backward
    replaced by the GEMM's 2 launches; no host read either way."""
    pytest.importorskip('triton')
    if not interpreting():
        pytest.skip('TRITON_INTERPRET is not 1')
    from host_syncs import HostSyncCounter, watch_launches
    from mmseg_stag.core import classifier_triton, stag_triton
    from test_base_method import images
    launches = []
    for module in (stag_triton, classifier_triton):
        watch_launches(monkeypatch, lambda fn, args: launches.append(
            fn.__name__), module)
    x = images(1, n=2)

    def step_ops(stag):
        method = tent_after_one_step(stag, x)
        launches.clear()
        counter = HostSyncCounter()
        with counter:
            method.adapt(Batch(x))
        assert counter.calls == []
        launches.clear()
        return collections.Counter(count_dispatched_ops(
            lambda: method.adapt(Batch(x))))
    tent = step_ops(None)
    stag = dict(beta0=50.0, gamma=5.0)
    written_out = step_ops(dict(stag, analytic_backward=True))
    assert sum((written_out - tent).values()) > 40
    fused = step_ops(dict(stag, triton=True, norm_tap='fused'))
    assert sorted(launches) == ['_backward_kernel', '_classify_kernel',
                                '_forward_kernel', '_grad_kernel']
    assert tent - fused == collections.Counter(
        {'convolution': 1, 'convolution_backward': 1})
    added = {op: n for op, n in (fused - tent).items()
             if op not in ALLOCATIONS}
    assert sum(added.values()) <= 6, added


#: STAG's implementations: their options, and how often each moves the
#: features through memory in a TENT step beyond TENT's own passes
FEATURE_PASSES = {
    # ||h|| read; c h written; c h and the classifier's dL/dh read, the
    # sum written
    'written out': (dict(analytic_backward=True), 6),
    'autograd': (dict(analytic_backward=False), 6),
    'triton': (dict(triton=True), 6),
    # ||h|| read; the addcmul's two reads and one write
    'tap': (dict(norm_tap=True), 4),
    'triton tap': (dict(triton=True, norm_tap=True), 4),
    # the GEMM's backward reads h for its epilogue; nothing else
    'triton fused': (dict(triton=True, norm_tap='fused'), 1),
}


@pytest.mark.parametrize('arm', list(FEATURE_PASSES))
def test_how_often_stag_moves_the_features(arm, monkeypatch):
    """The CPU proxy of STAG's in-step cost on a per-pixel head, where
    the features are the large tensor (the B5 at 960x540: 50 MB in bf16,
    ~15 us a pass at an H100's 3.35 TB/s): the passes over them that a
    TENT+STAG step makes beyond TENT's (test_base_method's model). Ops
    are counted through the dispatcher, the Triton launches by running
    them again on poisoned copies (``host_syncs.FeaturePasses``)."""
    from host_syncs import FeaturePasses, watch_launches
    from mmseg_stag.core import classifier_triton, stag_triton
    from test_base_method import images, make_model
    options, extra = FEATURE_PASSES[arm]
    if 'triton' in options:
        pytest.importorskip('triton')
        if not interpreting():
            pytest.skip('TRITON_INTERPRET is not 1')
    x = images(1, n=2)
    features = make_model().body(x)  # the classifier's input

    def passes(stag):
        method = tent_after_one_step(stag, x)
        counter = FeaturePasses(features.numel())
        with monkeypatch.context() as patch:
            for module in (stag_triton, classifier_triton):
                watch_launches(patch, lambda fn, args: None, module,
                               probe=counter.probe)
            with counter:
                method.adapt(Batch(x))
        return counter.passes
    tent = passes(None)
    got = passes(dict(beta0=50.0, gamma=5.0, **options))
    assert sum(got.values()) - sum(tent.values()) == extra, (got, tent)
    if options.get('norm_tap') == 'fused':
        # the classifier's own: its forward's read and its backward's
        # write, by cuDNN's convolution (frozen: h not read) or the GEMM
        assert got['_classify_kernel'] == 1 and got['_grad_kernel'] == 2
        assert tent['convolution'] - got['convolution'] == 1
        assert tent['convolution_backward'] - got[
            'convolution_backward'] == 1
