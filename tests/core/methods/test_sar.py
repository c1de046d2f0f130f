"""SAR against an independent transcription of the authors' code
(github.com/mr-eggplant/SAR: ``SAR.forward``/``reset``,
``forward_and_adapt_sar``, ``sam.py`` with ``torch.optim.SGD`` as base
optimizer, ``collect_params``; ``tests/reference/sar_reference.py``) on a
tiny per-sample classifier in float64, and on a tiny per-pixel network with
its pixels as the authors' samples."""
import copy
import math
from collections import OrderedDict

import pytest
import torch
import torch.nn as nn
from reference.adaptation_testbed import E0, LR, MLP_ADAPTER
from reference.adaptation_testbed import MLP_PROBE as FORWARD
from reference.adaptation_testbed import (OPT, SEG_ADAPTER, SEG_PROBE, C,
                                          PixelsAsSamples, adapt,
                                          assert_lists_close,
                                          assert_params_equal,
                                          assert_state_unchanged)
from reference.adaptation_testbed import make_mlp as make_model
from reference.adaptation_testbed import (make_seg_net, norm_params,
                                          pixel_forward, pixel_rows,
                                          pixels_as_samples, seg_images)
from reference.adaptation_testbed import vectors as batch
from reference.entropy_reference import softmax_entropy as ref_entropy
from reference.sar_reference import RefSAR

from mmseg_stag.core import (SAM, Batch, HeadProbe, STAGLoss, TaskAdapter,
                             build_method, use_batch_statistics)
from mmseg_stag.core.methods.sar import SAR, SAR_AUTHORS_EXCLUDE


def build(model, **kwargs):
    kwargs.setdefault('optimizer', OPT)
    kwargs.setdefault('recovery_threshold', 0.0)  # entropies >= 0: never
    method = SAR(**kwargs)
    method.configure(model, MLP_ADAPTER)
    return method


def reference(model, stag=None, forward=FORWARD, reset_constant=0.0):
    """The authors' SAR on a copy of ``model`` (SGD lr ``LR``, momentum
    0.9, on the norm affine parameters); recovery never fires unless
    ``reset_constant`` (the authors' literal 0.2) is given."""
    return RefSAR(model, forward, norm_params, lambda m: m[3], LR,
                  stag=stag, reset_constant=reset_constant)


def tempered(temperature):
    """FORWARD with its logits multiplied by ``temperature`` (a confident
    batch for > 1, an uncertain one for < 1)."""
    def forward(model, x):
        _, [(f, z)] = FORWARD(model, x)
        z = z * temperature
        return z, [(f, z)]
    return forward


def momentum_buffers(sam, params):
    """The base SGD's momentum buffers of ``params`` (``None`` if none)."""
    state = sam.base_optimizer.state
    return [state[p]['momentum_buffer'] if p in state else None
            for p in params]


def recording(snapshots):
    """FORWARD that records the norm parameters at each call."""
    def forward(model, x):
        snapshots.append([p.detach().clone() for p in norm_params(model)])
        return FORWARD(model, x)
    return forward


# ---------------------------------------------------------------------------
def test_registry_and_defaults():
    assert isinstance(build_method(dict(type='sar')), SAR)
    m = SAR()
    assert m.optimizer_cfg == dict(type='SGD', lr=0.00025, momentum=0.9)
    assert m.trainable_cfg == dict(kind='norm_affine')
    assert (m.entropy_margin, m.rho, m.recovery_threshold) == (0.4, 0.05, 0.2)
    assert m.exclude_regex == SAR_AUTHORS_EXCLUDE
    # the authors' recovery keeps the EMA and the momentum
    assert not m.recovery_restores_optimizer and not m.recovery_clears_ema
    model = make_model()
    m.configure(model, MLP_ADAPTER)
    assert m.e_margin == pytest.approx(0.4 * math.log(C))
    # SAM around the built base optimizer (the authors' SAM(params, SGD))
    assert isinstance(m.optimizer, SAM)
    assert isinstance(m.optimizer.base_optimizer, torch.optim.SGD)
    assert m.optimizer.param_groups[0]['rho'] == 0.05
    assert m.optimizer.param_groups[0]['params'] == norm_params(model)


def test_sam_step_matches_authors_code_over_batches():
    """Filters, SAM perturbation, EMA and parameters equal the authors'
    code with a hand-written SAM around torch.optim.SGD."""
    model = make_model()
    ref = reference(model)
    snaps = []
    method = build(model)
    saw_filter2 = False
    for k in range(4):
        x = batch(10 + k)
        with torch.no_grad():
            expected_pred = model(x)
        before = [p.detach().clone() for p in norm_params(model)]
        snaps.clear()
        pred, stats = adapt(method, x, forward=recording(snaps))
        out_ref, rec = ref.step(x, E0)
        # prediction: the first forward's logits, before any update
        torch.testing.assert_close(pred, expected_pred)
        torch.testing.assert_close(pred, out_ref)
        assert not pred.requires_grad
        # forward 1 at theta, forward 2 at theta + e_w
        assert len(snaps) == 2
        assert_lists_close(snaps[0], before)
        assert_lists_close(snaps[1], rec['perturbed'])
        assert_lists_close([s - b for s, b in zip(snaps[1], before)],
                           rec['e_w'])
        e_norm = torch.norm(torch.stack([e.norm() for e in rec['e_w']]))
        assert e_norm.item() == pytest.approx(0.05, rel=1e-9)
        assert stats['num_kept1'] == rec['n1'] and 0 < rec['n1'] < 16
        assert stats['num_kept2'] == rec['n2'] and rec['n2'] > 0
        saw_filter2 |= rec['n2'] < rec['n1']
        assert stats['loss1'] == pytest.approx(rec['loss1'], rel=1e-12)
        assert stats['loss2'] == pytest.approx(rec['loss2'], rel=1e-12)
        assert method.ema == pytest.approx(ref.ema, rel=1e-12)
        assert stats['updated'] == 1.0 and stats['recovered'] == 0.0
        assert_params_equal(model, ref.model)
    assert saw_filter2  # filter 2 dropped a filter-1 sample at least once
    assert method.num_updates == method.t == 4


def test_second_filter_only_among_first_filter_samples():
    """The authors index the second forward's entropies by filter 1: a
    sample unreliable in forward 1 never enters loss 2, even when it is
    confident in forward 2 (here made so by a logit offset)."""
    model = make_model()
    x = batch(10)
    with torch.no_grad():
        unreliable = ref_entropy(model(x)) >= E0
    assert 0 < int(unreliable.sum()) < 16
    offset = torch.zeros(16, C, dtype=torch.float64)
    offset[unreliable, 0] = 30.0  # confident in the second forward

    def scripted():
        calls = []

        def forward(m, inputs):
            _, [(f, z)] = FORWARD(m, inputs)
            if len(calls) % 2 == 1:
                z = z + offset
            calls.append(1)
            return z, [(f, z)]
        return forward

    ref = reference(model, forward=scripted())
    method = build(model)
    _, stats = adapt(method, x, forward=scripted())
    _, rec = ref.step(x, E0)
    assert stats['num_kept1'] == rec['n1'] == 16 - int(unreliable.sum())
    assert stats['num_kept2'] == rec['n2'] <= rec['n1']
    assert stats['loss2'] == pytest.approx(rec['loss2'], rel=1e-12)
    assert_params_equal(model, ref.model)


def test_reliable_entropy_filters_among_and_returns_kept():
    """The second forward's filter on its own: ``reliable_entropy`` keeps
    the samples with ``H < E0`` that are also in ``among``."""
    model = make_model()
    method = build(model)
    x = batch(10)
    fwd = method.task_adapter.forward(method.model, Batch(x))
    ent = ref_entropy(fwd.head_outputs[0][1]).detach()
    loss, kept = method.reliable_entropy(fwd)
    assert kept.tolist() == (ent < E0).tolist()
    torch.testing.assert_close(loss.detach(), ent[ent < E0].mean(),
                               rtol=1e-12, atol=1e-12)
    among = torch.zeros(16, dtype=torch.bool)
    among[::2] = True
    fwd = method.task_adapter.forward(method.model, Batch(x))
    loss, kept = method.reliable_entropy(fwd, among=among)
    assert kept.tolist() == ((ent < E0) & among).tolist()
    assert fwd.stats['num_kept'] == int(((ent < E0) & among).sum())
    torch.testing.assert_close(loss.detach(), ent[kept].mean(),
                               rtol=1e-12, atol=1e-12)
    fwd = method.task_adapter.forward(method.model, Batch(x))
    loss, kept = method.reliable_entropy(fwd, among=~(ent < E0))
    assert loss is None and not kept.any()


def test_empty_filters_match_authors_nan_path():
    """Filter 1 empty, then filter 2 empty: the authors' NaN losses give
    zero gradients, so SGD moves the parameters by momentum alone; the
    implementation reproduces that without NaN, never updates the EMA and
    never leaves the parameters perturbed."""
    model = make_model()
    ref = reference(model)
    method = build(model)
    x = batch(10)
    adapt(method, x)
    ref.step(x, E0)
    ema = method.ema
    # filter 1 empty
    x = batch(11)
    before = copy.deepcopy(model.state_dict())
    snaps = []
    method.e_margin = 1e-9
    _, stats = adapt(method, x, forward=recording(snaps))
    ref.step(x, margin=1e-9)
    assert len(snaps) == 1  # no second forward: it could change nothing
    assert stats['num_kept1'] == 0 and stats['updated'] == 0.0
    assert stats['momentum_only_step'] == 1.0
    assert 'loss1' not in stats
    # not updated: the same float; the authors' EMA is another computation
    # of it (float64 sums that round within an ulp or two on another CPU)
    assert method.ema == ema
    assert ema == pytest.approx(ref.ema, rel=1e-12)
    assert method.num_updates == 2  # the momentum-only step moved it
    assert_params_equal(model, ref.model)
    assert not torch.equal(model[1].weight, before['1.weight'])  # momentum
    # filter 1 keeps one sample, filter 2 none (SAM raises its entropy)
    x = batch(12)
    with torch.no_grad():
        ent = ref_entropy(model(x))
    margin = ent.min().item() + 1e-9
    snaps = []
    method.e_margin = margin
    _, stats = adapt(method, x, forward=recording(snaps))
    _, rec = ref.step(x, margin=margin)
    assert rec['n1'] == 1 and rec['n2'] == 0
    assert stats['num_kept1'] == 1 and stats['num_kept2'] == 0
    assert stats['updated'] == 0.0 and stats['momentum_only_step'] == 1.0
    assert_lists_close(snaps[1], rec['perturbed'])
    assert method.ema == ema
    assert ema == pytest.approx(ref.ema, rel=1e-12)
    assert_params_equal(model, ref.model)
    assert all(p.grad is None for p in model.parameters())

    # momentum_step_on_empty=False: nothing moves on an empty filter
    model = make_model()
    method = build(model, momentum_step_on_empty=False)
    adapt(method, batch(10))
    before = copy.deepcopy(model.state_dict())
    method.e_margin = 1e-9
    _, stats = adapt(method, batch(11))
    assert stats['momentum_only_step'] == 0.0
    assert_state_unchanged(model, before)


def test_fresh_empty_filter_changes_nothing():
    model = make_model()
    before = copy.deepcopy(model.state_dict())
    method = build(model, entropy_margin=1e-9)
    adapt(method, batch(5))
    assert method.num_updates == 0 and method.ema is None
    assert_state_unchanged(model, before)


# ---------------------------------------------------------------------------
# Recovery. The authors' SAR.forward: forward_and_adapt_sar, then
# `if reset_flag: self.reset()` (parameters and SAM.load_state_dict, then
# `self.ema = None`), then `self.ema = ema`: the EMA survives the reset, and
# so does the base SGD's momentum (not part of SAM's state).

#: temperatures of the batches of the recovery run: a confident first batch
#: sets the EMA below 0.2 (recovery), uncertain batches (the first of them
#: keeps no sample) raise it back through a run of recoveries; confident
#: batches pull it below 0.2 again for a second run
RECOVERY_TEMPERATURES = (4.0, 0.6, 0.6, 0.6, 0.6, 0.6, 0.6, 30.0, 30.0, 30.0,
                         1.0, 0.6, 0.6)
RECOVERY_FLAGS = [True] * 5 + [False] * 4 + [True] * 2 + [False] * 2


def test_recovery_matches_authors_code_over_batches():
    """Step for step with the authors' code at their threshold 0.2:
    recovery fires on consecutive batches (the EMA is kept through the
    recovery), stops, fires again; parameters, EMA and SGD momentum equal
    theirs after every batch."""
    model = make_model()
    initial = [p.detach().clone() for p in norm_params(model)]
    ref = reference(model, reset_constant=0.2)
    method = build(model, recovery_threshold=0.2)
    recovered = []
    for k, temperature in enumerate(RECOVERY_TEMPERATURES):
        x = batch(50 + k)
        ref.forward = tempered(temperature)
        pred, stats = adapt(method, x, forward=tempered(temperature))
        out_ref, rec = ref.step(x, E0)
        torch.testing.assert_close(pred, out_ref, rtol=1e-12, atol=1e-12)
        assert stats['recovered'] == float(rec['reset'])
        recovered.append(rec['reset'])
        assert method.ema == pytest.approx(ref.ema, rel=1e-12)
        assert method.ema == pytest.approx(rec['ema'], rel=1e-12)  # kept
        assert stats['ema'] == method.ema
        assert_params_equal(model, ref.model)
        assert_lists_close(
            momentum_buffers(method.optimizer, norm_params(model)),
            momentum_buffers(ref.optimizer, ref.params))
        if rec['reset']:
            assert_lists_close(norm_params(model), initial, tol=0)
            assert all(b.abs().sum() > 0 for b in momentum_buffers(
                method.optimizer, norm_params(model)))
    # two runs of recoveries, each followed by batches without one
    assert recovered == RECOVERY_FLAGS
    assert method.num_recoveries == 7
    # batch 1 kept no sample: a momentum-only step (counted: it moves the
    # parameters), then a recovery
    assert method.num_updates == len(RECOVERY_TEMPERATURES)


def test_recovery_options_are_visible_against_the_authors_code():
    """Each deviation changes the run of the test above (so that test
    would catch it): cleared momentum moves the first update after a
    recovery elsewhere; a cleared EMA stops the run of recoveries."""
    for option in ('recovery_restores_optimizer', 'recovery_clears_ema'):
        model = make_model()
        ref = reference(model, reset_constant=0.2)
        method = build(model, recovery_threshold=0.2, **{option: True})
        differs = False
        for k, temperature in enumerate(RECOVERY_TEMPERATURES[:6]):
            x = batch(50 + k)
            ref.forward = tempered(temperature)
            _, stats = adapt(method, x, forward=tempered(temperature))
            _, rec = ref.step(x, E0)
            differs |= not torch.allclose(model[1].weight,
                                          ref.model[1].weight)
            differs |= stats['recovered'] != float(rec['reset'])
        assert differs, option


def recovery_pair(**kwargs):
    """Two methods on copies of one model after the same first batch, one
    recovering (threshold 1e9) and one not (threshold 0); returns
    ``(recovering, its model, other, its model, initial parameters)``."""
    model = make_model()
    initial = [p.detach().clone() for p in norm_params(model)]
    other_model = copy.deepcopy(model)
    method = build(model, recovery_threshold=1e9, **kwargs)
    other = build(other_model, recovery_threshold=0.0)
    _, stats = adapt(method, batch(10))
    _, other_stats = adapt(other, batch(10))
    assert stats['recovered'] == 1.0 and other_stats['recovered'] == 0.0
    assert method.num_recoveries == 1 and method.num_updates == 1
    return method, model, other, other_model, initial


def test_recovery_keeps_ema_and_momentum_and_fires_again():
    method, model, other, other_model, initial = recovery_pair()
    assert_lists_close(norm_params(model), initial, tol=0)
    assert not torch.allclose(other_model[1].weight, initial[0])
    # the EMA and the momentum of the step before the recovery are kept
    assert method.ema is not None and method.ema == other.ema
    assert_lists_close(momentum_buffers(method.optimizer, norm_params(model)),
                       momentum_buffers(other.optimizer,
                                        norm_params(other_model)), tol=0)
    # ema < recovery_threshold still: the next batch recovers again
    ema = method.ema
    _, stats = adapt(method, batch(11))
    assert stats['recovered'] == 1.0 and method.num_recoveries == 2
    assert method.ema == pytest.approx(0.9 * ema + 0.1 * stats['loss_base2'],
                                       rel=1e-12)
    # the update after a recovery starts from theta_0 with the momentum
    method.recovery_threshold = 0.0
    buffers = [b.clone() for b in momentum_buffers(method.optimizer,
                                                   norm_params(model))]
    adapt(method, batch(12))
    fresh_model = make_model()
    fresh = build(fresh_model)
    adapt(fresh, batch(12))
    grads = momentum_buffers(fresh.optimizer, norm_params(fresh_model))
    for p, p0, b, g in zip(norm_params(model), initial, buffers, grads):
        # SGD, momentum 0.9, no dampening: theta_0 - lr (0.9 b + g)
        torch.testing.assert_close(p, p0 - LR * (0.9 * b + g), rtol=1e-12,
                                   atol=1e-12)


def test_restore_initial_is_the_authors_reset():
    """``restore_initial()``: parameters back, ``ema = None`` (the
    authors' ``SAR.reset``), momentum kept."""
    model = make_model()
    initial = [p.detach().clone() for p in norm_params(model)]
    method = build(model)
    adapt(method, batch(10))
    buffers = [b.clone() for b in momentum_buffers(method.optimizer,
                                                   norm_params(model))]
    method.restore_initial()
    assert method.ema is None and method.num_recoveries == 1
    assert_lists_close(norm_params(model), initial, tol=0)
    assert_lists_close(momentum_buffers(method.optimizer,
                                        norm_params(model)), buffers, tol=0)


def test_recovery_restores_optimizer_option_clears_the_momentum():
    method, model, other, _, initial = recovery_pair(
        recovery_restores_optimizer=True)
    sgd = method.optimizer.base_optimizer
    assert sgd.state_dict()['state'] == {}
    assert other.optimizer.base_optimizer.state_dict()['state'] != {}
    assert_lists_close(norm_params(model), initial, tol=0)
    assert method.ema == other.ema  # the EMA is still kept
    # the next update is a fresh method's first update
    method.recovery_threshold = 0.0
    adapt(method, batch(13))
    fresh_model = make_model()
    adapt(build(fresh_model), batch(13))
    assert_params_equal(model, fresh_model)


def test_recovery_clears_ema_option():
    method, model, other, other_model, initial = recovery_pair(
        recovery_clears_ema=True)
    assert method.ema is None and other.ema is not None
    assert_lists_close(norm_params(model), initial, tol=0)
    assert_lists_close(momentum_buffers(method.optimizer, norm_params(model)),
                       momentum_buffers(other.optimizer,
                                        norm_params(other_model)), tol=0)
    # the EMA restarts from the next batch's loss
    method.recovery_threshold = 0.0
    _, stats = adapt(method, batch(11))
    assert method.ema == stats['loss_base2']


def test_both_options_restart_the_method_from_scratch():
    """``recovery_restores_optimizer`` and ``recovery_clears_ema``
    together: after a recovery the method behaves as a freshly configured
    one."""
    method, model, _, _, _ = recovery_pair(recovery_restores_optimizer=True,
                                           recovery_clears_ema=True)
    method.recovery_threshold = 0.0
    fresh_model = make_model()
    fresh = build(fresh_model)
    for k in range(2):
        adapt(method, batch(20 + k))
        adapt(fresh, batch(20 + k))
        assert method.ema == pytest.approx(fresh.ema, rel=1e-12)
        assert_params_equal(model, fresh_model)


@pytest.mark.parametrize('restores_optimizer', [False, True])
def test_recovery_keeps_sam_and_base_param_groups_shared(
        restores_optimizer):
    model = make_model()
    method = build(model, recovery_threshold=1e9,
                   recovery_restores_optimizer=restores_optimizer)
    sam = method.optimizer
    assert sam.param_groups is sam.base_optimizer.param_groups
    _, stats = adapt(method, batch(10))
    assert stats['recovered'] == 1.0
    # e.g. a learning-rate change made through SAM must reach the SGD step
    assert sam.param_groups is sam.base_optimizer.param_groups


def test_updates_only_norm_affine_params():
    for norm in ('ln', 'bn'):
        model = make_model(norm=norm)
        if norm == 'bn':
            use_batch_statistics(model)
        before = copy.deepcopy(model.state_dict())
        method = build(model)
        assert [n for n, _ in method.params] == ['1.weight', '1.bias']
        assert [n for n, p in model.named_parameters()
                if p.requires_grad] == ['1.weight', '1.bias']
        adapt(method, batch(5))
        assert method.num_updates == 1
        for k, v in model.state_dict().items():
            changed = not torch.equal(v, before[k])
            assert changed == (k in ('1.weight', '1.bias')), (norm, k)


def test_authors_exclusion_of_the_last_stage():
    torch.manual_seed(0)
    model = nn.Sequential(OrderedDict(
        stem=nn.Linear(6, 8), bn1=nn.LayerNorm(8), act=nn.ReLU(),
        layer4=nn.Sequential(nn.Linear(8, 8), nn.LayerNorm(8), nn.ReLU()),
        fc=nn.Linear(8, C))).double()
    with torch.no_grad():
        model.fc.weight.mul_(6.0)
    before = copy.deepcopy(model.state_dict())
    method = SAR(optimizer=OPT, entropy_margin=0.9)
    method.configure(model, TaskAdapter(HeadProbe('fc')))
    assert [n for n, _ in method.params] == ['bn1.weight', 'bn1.bias']
    assert [n for n, p in model.named_parameters()
            if p.requires_grad] == ['bn1.weight', 'bn1.bias']
    adapt(method, batch(5))
    assert method.num_updates == 1
    for k, v in model.state_dict().items():
        changed = not torch.equal(v, before[k])
        assert changed == (k in ('bn1.weight', 'bn1.bias')), k
    # exclude_regex=None: layer4's norm is adapted too
    method = SAR(optimizer=OPT, exclude_regex=None)
    method.configure(model, TaskAdapter(HeadProbe('fc')))
    assert [n for n, _ in method.params] == [
        'bn1.weight', 'bn1.bias', 'layer4.1.weight', 'layer4.1.bias']

    class ViTNames(nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = nn.ModuleList(
                nn.Module() for _ in range(12))
            for b in self.blocks:
                b.norm1 = nn.LayerNorm(2)
            self.norm = nn.LayerNorm(2)
            self.fc_norm = nn.LayerNorm(2)
            self.head = nn.Linear(2, C)

    vit = ViTNames()
    method = SAR()
    method.configure(vit, TaskAdapter(HeadProbe('head')))
    modules = {n.rsplit('.', 1)[0] for n, _ in method.params}
    assert modules == {f'blocks.{i}.norm1' for i in range(9)} | {'fc_norm'}
    with pytest.raises(ValueError, match='exclude_regex'):
        SAR(exclude_regex='.*').configure(
            vit, TaskAdapter(HeadProbe('head')))


def test_stag_objective_beta_decay_and_empty_filter():
    beta0, gamma = 2.0, 3.0
    stag_loss = STAGLoss()
    model = make_model()
    ref = reference(model, stag=stag_loss)
    method = build(model, stag=dict(beta0=beta0, gamma=gamma))
    for k in range(3):
        x = batch(30 + k)
        beta = beta0 * math.exp(-k / gamma)
        # independent L_STAG of both forwards, at theta and theta + e_w
        _, [(f1, z1)] = FORWARD(ref.model, x)
        l_stag1 = stag_loss(f1, z1, ref.model[3].weight,
                            ref.model[3].bias).item()
        _, rec = ref.step(x, E0, beta=beta)
        _, stats = adapt(method, x)
        assert stats['beta1'] == stats['beta2'] == pytest.approx(beta,
                                                                 rel=1e-12)
        assert stats['loss_stag1'] == pytest.approx(l_stag1, rel=1e-10)
        for i in (1, 2):
            assert stats[f'loss{i}'] == pytest.approx(
                stats[f'loss_base{i}'] + beta * stats[f'loss_stag{i}'],
                rel=1e-12)
        assert stats['loss1'] == pytest.approx(rec['loss1'], rel=1e-10)
        assert stats['loss2'] == pytest.approx(rec['loss2'], rel=1e-10)
        assert method.ema == pytest.approx(ref.ema, rel=1e-12)
        assert_params_equal(model, ref.model)
    assert method.num_updates == method.t == 3
    assert method.beta == pytest.approx(beta0 * math.exp(-3 / gamma))

    # an empty filter with STAG still makes a full SAM update on
    # beta_t L_STAG alone (even with an empty momentum buffer)
    model = make_model()
    before = copy.deepcopy(model.state_dict())
    ref = reference(model, stag=stag_loss)
    snaps = []
    method = build(model, entropy_margin=1e-9,
                   stag=dict(beta0=beta0, gamma=gamma))
    x = batch(5)
    _, stats = adapt(method, x, forward=recording(snaps))
    _, rec = ref.step(x, margin=1e-9, beta=beta0)
    assert stats['num_kept1'] == 0 and 'loss_base1' not in stats
    assert stats['updated'] == 1.0 and method.num_updates == 1
    assert method.ema is None
    assert stats['loss1'] == pytest.approx(rec['loss1'], rel=1e-10)
    assert_lists_close(snaps[1], rec['perturbed'])
    assert_params_equal(model, ref.model)
    assert not torch.equal(model[1].weight, before['1.weight'])


def test_same_seed_same_result():
    def run():
        model = make_model(seed=3)
        method = build(model, recovery_threshold=0.2)
        for k in range(3):
            adapt(method, batch(40 + k))
        return model.state_dict(), method.ema

    (a, ea), (b, eb) = run(), run()
    for k in a:
        assert torch.equal(a[k], b[k]), k
    assert ea == eb


# ---------------------------------------------------------------------------
# Segmentation: every pixel a sample.
def scaled(forward, temperature):
    """``forward`` with its logits multiplied by ``temperature``."""
    def run(model, x):
        _, [(f, z)] = forward(model, x)
        z = z * temperature
        return z, [(f, z)]
    return run


#: temperatures of the per-pixel recovery run at the authors' 0.2: a
#: confident batch, uncertain ones (a run of recoveries until the EMA climbs
#: above 0.2), confident ones (a second recovery)
PIXEL_TEMPERATURES = (30.0, ) + (0.6, ) * 6 + (30.0, 30.0, 1.0)
PIXEL_RECOVERY_FLAGS = [True] * 5 + [False] * 3 + [True, False]


@pytest.mark.parametrize('case', ['plain', 'stag', 'recovery'])
def test_per_pixel_is_the_authors_code_with_pixels_as_samples(case):
    """On a per-pixel network, both filters (the second among the pixels of
    the first), the SAM steps, the EMA, the recovery and the parameters
    after every batch equal the authors' code run on the same network seen
    as a per-sample model of its pixels (PixelsAsSamples)."""
    net = make_seg_net()
    threshold = 0.2 if case == 'recovery' else 0.0
    stag = dict(beta0=2.0, gamma=3.0) if case == 'stag' else None
    ref = RefSAR(PixelsAsSamples(net), pixel_forward,
                 lambda m: norm_params(m.net), lambda m: m.net[3], LR,
                 stag=STAGLoss() if stag else None,
                 reset_constant=threshold)
    method = SAR(optimizer=OPT, recovery_threshold=threshold, stag=stag)
    method.configure(net, SEG_ADAPTER)
    temperatures = PIXEL_TEMPERATURES if case == 'recovery' else (1.0, ) * 4
    recovered, filtered = [], False
    for k, temperature in enumerate(temperatures):
        x = seg_images(10 + k)
        beta = method.beta
        ref.forward = scaled(pixel_forward, temperature)
        pred, stats = adapt(method, x,
                            forward=scaled(SEG_PROBE, temperature))
        out_ref, rec = ref.step(pixels_as_samples(x), E0, beta=beta)
        torch.testing.assert_close(pixel_rows(pred), out_ref, rtol=1e-12,
                                   atol=1e-12)
        assert stats.get('num_kept1', 0) == rec['n1']
        assert stats.get('num_kept2', 0) == rec['n2']
        filtered |= 0 < rec['n2'] < rec['n1'] < 128
        if rec['n1']:
            assert stats['loss1'] == pytest.approx(rec['loss1'], rel=1e-10)
        if rec['n2'] or stag:
            assert stats['loss2'] == pytest.approx(rec['loss2'], rel=1e-10)
        assert stats['recovered'] == float(rec['reset'])
        recovered.append(rec['reset'])
        assert method.ema == pytest.approx(ref.ema, rel=1e-12)
        assert_params_equal(net, ref.model.net)
        assert_lists_close(
            momentum_buffers(method.optimizer, norm_params(net)),
            momentum_buffers(ref.optimizer, ref.params))
    assert filtered  # filter 2 dropped some pixels of filter 1
    assert recovered == (PIXEL_RECOVERY_FLAGS if case == 'recovery' else
                      [False] * len(temperatures))
