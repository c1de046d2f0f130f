"""SAR against an independent transcription of the authors' code
(github.com/mr-eggplant/SAR: ``forward_and_adapt_sar``, ``sam.py`` with
``torch.optim.SGD`` as base optimizer, ``collect_params``) on a tiny
per-sample classifier in float64."""
import copy
import math
from collections import OrderedDict

import pytest
import torch
import torch.nn as nn
from mmseg.registry import MODELS

import mmseg_stag  # noqa: F401  (registers STAGLoss)
from mmseg_stag.classification.forward import make_forward
from mmseg_stag.methods.base import use_batch_statistics
from mmseg_stag.methods.sar import SAR, SAR_AUTHORS_EXCLUDE
from mmseg_stag.registry import TTA_METHODS

from entropy_filter_fixtures import (  # noqa: F401  (shared fixtures)
    C, E0, FORWARD, LR, OPT, batch, make_model)


def build(model, **kwargs):
    kwargs.setdefault('optimizer', OPT)
    kwargs.setdefault('reset_constant', 0.0)  # entropies >= 0: never
    method = SAR(**kwargs)
    method.configure(model, model[3])
    return method


def norm_params(model):
    return [model[1].weight, model[1].bias]


def ref_entropy(x):
    return -(x.softmax(1) * x.log_softmax(1)).sum(1)


class Reference:
    """The authors' ``forward_and_adapt_sar`` with their SAM (rho 0.05,
    non-adaptive) around ``torch.optim.SGD``; optionally ``+ beta *
    STAGLoss`` on each forward (the base term left out when its filter is
    empty instead of being NaN)."""

    def __init__(self, model, rho=0.05, stag=None, forward=FORWARD):
        self.forward = forward
        self.model = copy.deepcopy(model)
        self.model.requires_grad_(False)
        self.params = norm_params(self.model)
        for p in self.params:
            p.requires_grad_(True)
        self.sgd = torch.optim.SGD(self.params, LR, momentum=0.9)
        self.rho = rho
        self.stag = stag
        self.ema = None

    def _loss(self, feats, logits, ent, ids, beta):
        loss = ent[ids].mean(0)  # NaN when empty, as in the authors' code
        if self.stag is None:
            return loss
        l_stag = beta * self.stag(feats, logits, self.model[3].weight,
                                  self.model[3].bias)
        return l_stag if len(ids[0]) == 0 else loss + l_stag

    def step(self, x, margin=E0, beta=0.0):
        rec = {}
        self.sgd.zero_grad()
        _, [(f1, outputs)] = self.forward(self.model, x)
        entropys = ref_entropy(outputs)
        filter_ids_1 = torch.where(entropys < margin)
        loss = self._loss(f1, outputs, entropys, filter_ids_1, beta)
        loss.backward()
        # SAM.first_step (sam.py)
        with torch.no_grad():
            grad_norm = torch.norm(torch.stack(
                [p.grad.norm(p=2) for p in self.params
                 if p.grad is not None]), p=2)
            scale = self.rho / (grad_norm + 1e-12)
            old = [p.data.clone() for p in self.params]
            rec['e_w'] = [p.grad * scale for p in self.params]
            for p in self.params:
                p.add_(p.grad * scale)
        rec['perturbed'] = [p.detach().clone() for p in self.params]
        self.sgd.zero_grad()
        _, [(f2, out2)] = self.forward(self.model, x)
        entropys2 = ref_entropy(out2)[filter_ids_1]
        filter_ids_2 = torch.where(entropys2 < margin)
        loss_second = entropys2[filter_ids_2].mean(0)
        if not math.isnan(loss_second.item()):
            self.ema = (loss_second.item() if self.ema is None else
                        0.9 * self.ema + 0.1 * loss_second.item())
        if self.stag is not None:
            l2 = beta * self.stag(f2, out2, self.model[3].weight,
                                  self.model[3].bias)
            loss_second = (l2 if len(filter_ids_2[0]) == 0 else
                           loss_second + l2)
        loss_second.backward()
        # SAM.second_step
        for p, o in zip(self.params, old):
            p.data = o
        self.sgd.step()
        self.sgd.zero_grad()
        rec.update(n1=len(filter_ids_1[0]), n2=len(filter_ids_2[0]),
                   loss1=loss.item(), loss2=loss_second.item())
        return outputs.detach(), rec


def recording(snapshots):
    """FORWARD that records the norm parameters at each call."""
    def forward(model, x):
        snapshots.append([p.detach().clone() for p in norm_params(model)])
        return FORWARD(model, x)
    return forward


def assert_params_equal(a, b):
    for (na, pa), (nb, pb) in zip(a.named_parameters(),
                                  b.named_parameters()):
        assert na == nb
        torch.testing.assert_close(pa, pb, rtol=1e-12, atol=1e-12, msg=na)


def assert_lists_close(a, b):
    for x, y in zip(a, b, strict=True):
        torch.testing.assert_close(x, y, rtol=1e-12, atol=1e-12)


# ---------------------------------------------------------------------------
def test_registry_and_defaults():
    for name in ('SAR', 'sar'):
        assert isinstance(TTA_METHODS.build(dict(type=name)), SAR)
    m = SAR()
    assert m.optimizer_cfg == dict(type='SGD', lr=0.00025, momentum=0.9)
    assert m.trainable_cfg == dict(kind='norm_affine')
    assert (m.entropy_margin, m.rho, m.reset_constant) == (0.4, 0.05, 0.2)
    assert m.exclude_regex == SAR_AUTHORS_EXCLUDE
    model = make_model()
    m.configure(model, model[3])
    assert m.e_margin == pytest.approx(0.4 * math.log(C))
    assert isinstance(m.optimizer, torch.optim.SGD)


def test_sam_step_matches_authors_code_over_batches():
    """Filters, SAM perturbation, EMA and parameters equal the authors'
    code with a hand-written SAM around torch.optim.SGD."""
    model = make_model()
    ref = Reference(model)
    snaps = []
    method = build(model)
    saw_filter2 = False
    for k in range(4):
        x = batch(10 + k)
        with torch.no_grad():
            expected_pred = model(x)
        before = [p.detach().clone() for p in norm_params(model)]
        snaps.clear()
        pred = method.adapt(recording(snaps), x)
        out_ref, rec = ref.step(x)
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
        stats = method.last_stats
        assert stats['num_kept1'] == rec['n1'] and 0 < rec['n1'] < 16
        assert stats['num_kept2'] == rec['n2'] and rec['n2'] > 0
        saw_filter2 |= rec['n2'] < rec['n1']
        assert stats['loss1'] == pytest.approx(rec['loss1'], rel=1e-12)
        assert stats['loss2'] == pytest.approx(rec['loss2'], rel=1e-12)
        assert method.ema == pytest.approx(ref.ema, rel=1e-12)
        assert stats['updated'] == 1.0 and stats['reset'] == 0.0
        assert_params_equal(model, ref.model)
    assert saw_filter2  # filter 2 dropped a filter-1 sample at least once
    assert method.num_updates == method.step == 4


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

    ref = Reference(model, forward=scripted())
    method = build(model)
    method.adapt(scripted(), x)
    _, rec = ref.step(x)
    stats = method.last_stats
    assert stats['num_kept1'] == rec['n1'] == 16 - int(unreliable.sum())
    assert stats['num_kept2'] == rec['n2'] <= rec['n1']
    assert stats['loss2'] == pytest.approx(rec['loss2'], rel=1e-12)
    assert_params_equal(model, ref.model)


def test_empty_filters_match_authors_nan_path():
    """Filter 1 empty, then filter 2 empty: the authors' NaN losses give
    zero gradients, so SGD moves the parameters by momentum alone; the
    implementation reproduces that without NaN, never updates the EMA and
    never leaves the parameters perturbed."""
    model = make_model()
    ref = Reference(model)
    method = build(model)
    x = batch(10)
    method.adapt(FORWARD, x)
    ref.step(x)
    ema = method.ema
    # filter 1 empty
    x = batch(11)
    before = copy.deepcopy(model.state_dict())
    snaps = []
    method.e_margin = 1e-9
    method.adapt(recording(snaps), x)
    ref.step(x, margin=1e-9)
    assert len(snaps) == 1  # no second forward: it could change nothing
    stats = method.last_stats
    assert stats['num_kept1'] == 0 and stats['updated'] == 0.0
    assert stats['momentum_only_step'] == 1.0
    assert 'loss1' not in stats
    assert method.ema == ema == ref.ema
    assert method.num_updates == 1
    assert_params_equal(model, ref.model)
    assert not torch.equal(model[1].weight, before['1.weight'])  # momentum
    # filter 1 keeps one sample, filter 2 none (SAM raises its entropy)
    x = batch(12)
    with torch.no_grad():
        ent = ref_entropy(model(x))
    margin = ent.min().item() + 1e-9
    before = [p.detach().clone() for p in norm_params(model)]
    snaps = []
    method.e_margin = margin
    method.adapt(recording(snaps), x)
    _, rec = ref.step(x, margin=margin)
    assert rec['n1'] == 1 and rec['n2'] == 0
    stats = method.last_stats
    assert stats['num_kept1'] == 1 and stats['num_kept2'] == 0
    assert stats['updated'] == 0.0 and stats['momentum_only_step'] == 1.0
    assert_lists_close(snaps[1], rec['perturbed'])
    assert method.ema == ema == ref.ema
    assert_params_equal(model, ref.model)
    assert all(p.grad is None for p in model.parameters())

    # momentum_step_on_empty=False: nothing moves on an empty filter
    model = make_model()
    method = build(model, momentum_step_on_empty=False)
    method.adapt(FORWARD, batch(10))
    before = copy.deepcopy(model.state_dict())
    method.e_margin = 1e-9
    method.adapt(FORWARD, batch(11))
    assert method.last_stats['momentum_only_step'] == 0.0
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]), k


def test_fresh_empty_filter_changes_nothing():
    model = make_model()
    before = copy.deepcopy(model.state_dict())
    method = build(model, entropy_margin=1e-9)
    method.adapt(FORWARD, batch(5))
    assert method.num_updates == 0 and method.ema is None
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]), k


def test_reset_restores_params_and_optimizer_state():
    model = make_model()
    initial = [p.detach().clone() for p in norm_params(model)]
    method = build(model)
    initial_opt = copy.deepcopy(method.optimizer.state_dict())
    assert initial_opt['state'] == {}
    method.adapt(FORWARD, batch(10))
    assert method.optimizer.state_dict()['state'] != {}
    ema1 = method.ema
    assert ema1 is not None and method.num_resets == 0
    # EMA of the second-forward base loss
    method.adapt(FORWARD, batch(11))
    assert method.ema == pytest.approx(
        0.9 * ema1 + 0.1 * method.last_stats['loss_base2'], rel=1e-12)
    # recovery: ema < reset_constant after this update
    method.reset_constant = 1e9
    method.adapt(FORWARD, batch(12))
    assert method.last_stats['reset'] == 1.0 and method.num_resets == 1
    assert method.ema is None
    assert_lists_close(norm_params(model), initial)
    assert method.optimizer.state_dict() == initial_opt
    assert method.num_updates == 3  # updates are still counted
    # the next step equals a fresh method's first step (momentum cleared)
    method.reset_constant = 0.0
    method.adapt(FORWARD, batch(13))
    fresh_model = make_model()
    fresh = build(fresh_model)
    fresh.adapt(FORWARD, batch(13))
    assert_params_equal(model, fresh_model)

    # reset_optimizer=False (the authors' SAM keeps its SGD's momentum)
    model = make_model()
    method = build(model, reset_optimizer=False)
    method.adapt(FORWARD, batch(10))
    method.reset_constant = 1e9
    method.adapt(FORWARD, batch(12))
    assert method.num_resets == 1
    assert_lists_close(norm_params(model), initial)
    state = method.optimizer.state_dict()['state']
    assert state[0]['momentum_buffer'].abs().sum() > 0


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
        method.adapt(FORWARD, batch(5))
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
    method.configure(model, model.fc)
    assert [n for n, _ in method.params] == ['bn1.weight', 'bn1.bias']
    assert [n for n, p in model.named_parameters()
            if p.requires_grad] == ['bn1.weight', 'bn1.bias']
    method.adapt(make_forward('fc'), batch(5))
    assert method.num_updates == 1
    for k, v in model.state_dict().items():
        changed = not torch.equal(v, before[k])
        assert changed == (k in ('bn1.weight', 'bn1.bias')), k
    # exclude_regex=None: layer4's norm is adapted too
    method = SAR(optimizer=OPT, exclude_regex=None)
    method.configure(model, model.fc)
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
    method.configure(vit, vit.head)
    modules = {n.rsplit('.', 1)[0] for n, _ in method.params}
    assert modules == {f'blocks.{i}.norm1' for i in range(9)} | {'fc_norm'}
    with pytest.raises(ValueError, match='exclude_regex'):
        SAR(exclude_regex='.*').configure(vit, vit.head)


def test_stag_objective_beta_decay_and_empty_filter():
    beta0, gamma = 2.0, 3.0
    stag_loss = MODELS.build(dict(type='STAGLoss'))
    model = make_model()
    ref = Reference(model, stag=stag_loss)
    method = build(model, stag=dict(beta0=beta0, gamma=gamma))
    for k in range(3):
        x = batch(30 + k)
        beta = beta0 * math.exp(-k / gamma)
        # independent L_STAG of both forwards, at theta and theta + e_w
        _, [(f1, z1)] = FORWARD(ref.model, x)
        l_stag1 = stag_loss(f1, z1, ref.model[3].weight,
                            ref.model[3].bias).item()
        _, rec = ref.step(x, beta=beta)
        method.adapt(FORWARD, x)
        stats = method.last_stats
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
    assert method.num_updates == method.step == 3
    assert method.beta == pytest.approx(beta0 * math.exp(-3 / gamma))

    # an empty filter with STAG still makes a full SAM update on
    # beta_t L_STAG alone (even with an empty momentum buffer)
    model = make_model()
    before = copy.deepcopy(model.state_dict())
    ref = Reference(model, stag=stag_loss)
    snaps = []
    method = build(model, entropy_margin=1e-9,
                   stag=dict(beta0=beta0, gamma=gamma))
    x = batch(5)
    method.adapt(recording(snaps), x)
    _, rec = ref.step(x, margin=1e-9, beta=beta0)
    stats = method.last_stats
    assert stats['num_kept1'] == 0 and 'loss_base1' not in stats
    assert stats['updated'] == 1.0 and method.num_updates == 1
    assert method.ema is None
    assert stats['loss1'] == pytest.approx(rec['loss1'], rel=1e-10)
    assert_lists_close(snaps[1], rec['perturbed'])
    assert_params_equal(model, ref.model)
    assert not torch.equal(model[1].weight, before['1.weight'])


def test_per_pixel_outputs_rejected():
    model = make_model()
    method = build(model)

    def per_pixel(m, x):
        logits = m[3].weight.new_zeros(2, C, 3, 3) + m[1].weight.sum()
        return logits, [(logits.new_zeros(2, 8, 3, 3), logits)]

    before = copy.deepcopy(model.state_dict())
    with pytest.raises(ValueError, match='per-sample classification'):
        method.adapt(per_pixel, batch(0))
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]), k


def test_same_seed_same_result():
    def run():
        model = make_model(seed=3)
        method = build(model, reset_constant=0.2)
        for k in range(3):
            method.adapt(FORWARD, batch(40 + k))
        return model.state_dict(), method.ema

    (a, ea), (b, eb) = run(), run()
    for k in a:
        assert torch.equal(a[k], b[k]), k
    assert ea == eb
