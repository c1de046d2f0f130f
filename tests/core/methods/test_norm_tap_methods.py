"""``stag.norm_tap=True`` in every method with STAG (test_method_state's
configurations): each forward pass the method computes STAG on is tapped
(a pass that is not raises), and the stream's predictions and parameters
equal those without the tap to float32 rounding."""
import pytest
import torch
from reference.adaptation_testbed import adapt
from test_method_state import BATCHES, METHODS, start

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
