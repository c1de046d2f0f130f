"""EATA against an independent transcription of the authors' code
(github.com/mr-eggplant/EATA: ``forward_and_adapt_eata``,
``update_model_probs``, the Fisher loop of ``main.py``;
``tests/reference/eata_reference.py``) on a tiny per-sample classifier in
float64, and on a tiny per-pixel network with its pixels as the authors'
samples."""
import copy
import math

import pytest
import torch
import torch.nn.functional as F
from reference.adaptation_testbed import E0, MLP_ADAPTER
from reference.adaptation_testbed import MLP_PROBE as FORWARD
from reference.adaptation_testbed import (OPT, SEG_ADAPTER, C, PixelsAsSamples,
                                          adapt, assert_params_equal)
from reference.adaptation_testbed import make_mlp as make_model
from reference.adaptation_testbed import (make_seg_net, norm_params,
                                          pixel_rows, pixels_as_samples,
                                          seg_images, sgd_on_norm_params)
from reference.adaptation_testbed import vectors as batch
from reference.eata_reference import (ref_fishers, ref_forward_and_adapt_eata,
                                      ref_update_model_probs)
from reference.entropy_reference import softmax_entropy as ref_entropy

from mmseg_stag.core import Batch, STAGLoss, build_method, use_batch_statistics
from mmseg_stag.core.methods.eata import EATA


def build(model, **kwargs):
    kwargs.setdefault('optimizer', OPT)
    method = EATA(**kwargs)
    method.configure(model, MLP_ADAPTER)
    return method


# ---------------------------------------------------------------------------
def test_registry_and_defaults():
    assert isinstance(build_method(dict(type='eata')), EATA)
    m = EATA()
    assert m.optimizer_cfg == dict(type='SGD', lr=0.00025, momentum=0.9)
    assert m.trainable_cfg == dict(kind='norm_affine')
    assert (m.entropy_margin, m.d_margin, m.fisher_alpha) == (0.4, 0.05,
                                                              2000.0)
    assert m.needs_source_data and not EATA(fisher_alpha=0).needs_source_data
    model = make_model()
    m.configure(model, MLP_ADAPTER)
    assert m.e_margin == pytest.approx(0.4 * math.log(C))


def test_select_filters_and_model_probs_by_hand():
    """Both filters on hand-made logits, default d_margin."""
    method = build(make_model(), fisher_alpha=0)
    logits = torch.tensor([
        [9., 0., 0., 0., 0.],   # reliable, class 0
        [0., 0., 9., 0., 0.],   # reliable, class 2
        [1., 1., 1., 1., 1.],   # unreliable (H = ln 5)
        [0., 0., 0., 0., 9.],   # reliable, class 4
    ], dtype=torch.float64)
    # no p_bar yet: filter 1 only; p_bar = mean of the reliable probs
    ent, reliable, selected = method.select(logits)
    torch.testing.assert_close(ent, ref_entropy(logits))
    assert reliable.tolist() == [True, True, False, True]
    assert selected.tolist() == reliable.tolist()
    probs = logits.softmax(1)
    torch.testing.assert_close(method.model_probs, probs[[0, 1, 3]].mean(0))
    # p_bar concentrated on class 0: only the class-0 sample is redundant
    method.model_probs = torch.tensor([0.998, 0.0005, 0.0005, 0.0005,
                                       0.0005], dtype=torch.float64)
    p_bar = method.model_probs.clone()
    cos = F.cosine_similarity(p_bar[None], probs, dim=1)
    assert cos[0] > 0.05 and cos[1] < 0.05 and cos[3] < 0.05
    _, reliable, selected = method.select(logits)
    assert reliable.tolist() == [True, True, False, True]
    assert selected.tolist() == [False, True, False, True]
    torch.testing.assert_close(
        method.model_probs, 0.9 * p_bar + 0.1 * probs[[1, 3]].mean(0))
    # nothing selected: p_bar unchanged
    _, _, selected = method.select(logits[[0, 2]])
    assert not selected.any()
    torch.testing.assert_close(
        method.model_probs, 0.9 * p_bar + 0.1 * probs[[1, 3]].mean(0))
    # no p_bar and nothing reliable: stays None
    fresh = build(make_model(), fisher_alpha=0)
    fresh.select(logits[[2]])
    assert fresh.model_probs is None


@pytest.mark.parametrize('d_margin', [0.05, 0.7])
def test_eta_matches_authors_code_over_batches(d_margin):
    """ETA (fisher_alpha=0): filters, weights, loss, p_bar and parameters
    equal the authors' forward_and_adapt_eata over consecutive batches."""
    model = make_model()
    ref, ref_opt = sgd_on_norm_params(model)
    method = build(model, fisher_alpha=0, d_margin=d_margin)
    probs = None
    saw_redundant = False
    for k in range(4):
        x = batch(10 + k)
        with torch.no_grad():
            expected_pred = model(x)
        out_ref, n2, n1, probs, loss = ref_forward_and_adapt_eata(
            x, ref, ref_opt, None, E0, probs, 0.0, d_margin)
        pred, stats = adapt(method, x)
        torch.testing.assert_close(pred, expected_pred)
        torch.testing.assert_close(pred, out_ref.detach())
        assert stats['num_reliable'] == n1
        assert stats['num_selected'] == n2
        assert 0 < n1 < x.shape[0]
        saw_redundant |= n2 < n1
        if n2:
            assert stats['loss'] == pytest.approx(loss.item(), rel=1e-12)
        else:
            assert 'loss' not in stats
        torch.testing.assert_close(method.model_probs, probs, rtol=1e-12,
                                   atol=1e-12)
        assert_params_equal(model, ref)
    if d_margin == 0.7:
        assert saw_redundant  # the second filter was exercised
    assert method.num_samples_update_1 >= method.num_samples_update_2 > 0


def test_weights_and_loss_by_hand():
    """One step from p_bar = None: loss = mean of H exp(-(H - E0)) over the
    reliable samples, and the update is SGD on it."""
    model = make_model()
    method = build(model, fisher_alpha=0)
    x = batch(3)
    with torch.no_grad():
        ent = ref_entropy(model(x))
    keep = ent < E0
    weights = torch.exp(-(ent[keep] - E0))
    assert torch.all(weights > 1)  # H < E0
    expected = (ent[keep] * weights).mean()
    ref, ref_opt = sgd_on_norm_params(model)
    out = ref(x)
    h = ref_entropy(out)[keep]
    (h * torch.exp(-(h.detach() - E0))).mean().backward()
    ref_opt.step()
    _, stats = adapt(method, x)
    assert stats['loss'] == pytest.approx(expected.item(), rel=1e-12)
    assert stats['loss_base'] == stats['loss']
    assert_params_equal(model, ref)


def test_fisher_matches_hand_loop_and_eata_matches_authors_code():
    model = make_model()
    source = [batch(100 + i, n=8) for i in range(3)]
    source_model = copy.deepcopy(model)
    expected = ref_fishers(source_model, norm_params(source_model),
                           ['1.weight', '1.bias'], source)
    ref, ref_opt = sgd_on_norm_params(model)
    method = build(model, fisher_alpha=2000.0, d_margin=0.7)
    assert method.needs_source_data
    # batches with data samples (labels) are accepted; labels are ignored
    method.fit_source([Batch(x, list(torch.zeros(8))) for x in source])
    assert set(method.fishers) == set(expected)
    for name, (fisher, theta0) in expected.items():
        torch.testing.assert_close(method.fishers[name][0], fisher,
                                   rtol=1e-12, atol=1e-15)
        torch.testing.assert_close(method.fishers[name][1], theta0)
        assert fisher.abs().sum() > 0
    # no gradient left, no parameter moved, nothing else got a gradient
    assert all(p.grad is None for p in model.parameters())
    assert_params_equal(model, ref)
    # EWC term is zero at theta_0, then equals the hand value
    assert method.ewc_term().item() == 0.0
    with torch.no_grad():
        model[1].weight.add_(torch.linspace(-0.2, 0.2, 8,
                                            dtype=torch.float64))
        model[1].bias.sub_(0.05)
        ref[1].weight.copy_(model[1].weight)
        ref[1].bias.copy_(model[1].bias)
    hand = 2000.0 * sum(
        (f * (p.detach() - t0)**2).sum() for (f, t0), p in zip(
            expected.values(), norm_params(model)))
    torch.testing.assert_close(method.ewc_term().detach(), hand)
    assert hand > 0
    # two adaptation steps with the EWC term, against the authors' code
    probs = None
    for k in range(2):
        x = batch(20 + k)
        _, n2, n1, probs, loss = ref_forward_and_adapt_eata(
            x, ref, ref_opt, expected, E0, probs, 2000.0, 0.7)
        _, stats = adapt(method, x)
        assert n2 > 0
        assert stats['loss'] == pytest.approx(loss.item(), rel=1e-10)
        assert stats['loss_ewc'] > 0
        assert_params_equal(model, ref)


def test_fisher_required_before_adapt_and_eta_needs_none():
    model = make_model()
    method = build(model)
    with pytest.raises(RuntimeError, match='fit_source'):
        adapt(method, batch(0))
    with pytest.raises(RuntimeError, match='fit_source'):
        method.ewc_term()
    with pytest.raises(ValueError, match='no batches'):
        method.fit_source([])
    eta = build(make_model(), fisher_alpha=0)
    eta.fit_source([Batch(batch(1))])  # no-op
    assert eta.fishers is None
    adapt(eta, batch(0))
    with pytest.raises(RuntimeError, match='configure'):
        EATA().fit_source([Batch(batch(1))])


def test_updates_only_norm_affine_params():
    for norm in ('ln', 'bn'):
        model = make_model(norm=norm)
        if norm == 'bn':
            use_batch_statistics(model)
        before = copy.deepcopy(model.state_dict())
        method = build(model, fisher_alpha=0)
        assert [n for n, _ in method.params] == ['1.weight', '1.bias']
        assert [n for n, p in model.named_parameters()
                if p.requires_grad] == ['1.weight', '1.bias']
        adapt(method, batch(5))
        assert method.num_updates == 1
        for k, v in model.state_dict().items():
            changed = not torch.equal(v, before[k])
            assert changed == (k in ('1.weight', '1.bias')), (norm, k)


def test_no_selected_sample_no_update_without_stag():
    model = make_model()
    before = copy.deepcopy(model.state_dict())
    method = build(model, fisher_alpha=0, entropy_margin=1e-9)
    _, stats = adapt(method, batch(5))
    assert method.num_updates == 0 and method.t == 0
    assert stats['num_reliable'] == 0
    assert 'loss' not in stats
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]), k
    assert method.optimizer.state_dict()['state'] == {}


def test_stag_objective_beta_decay_and_empty_filter():
    beta0, gamma = 2.0, 3.0
    stag_loss = STAGLoss()
    model = make_model()
    ref, ref_opt = sgd_on_norm_params(model)
    method = build(model, fisher_alpha=0,
                   stag=dict(beta0=beta0, gamma=gamma))
    probs = None
    for k in range(3):
        x = batch(30 + k)
        # independent total: authors' EATA loss + beta_t * STAGLoss
        _, [(feats, logits)] = FORWARD(ref, x)
        ent = ref_entropy(logits)
        ids1 = torch.where(ent < E0)[0]
        if probs is None:
            sel = ids1
        else:
            cos = F.cosine_similarity(probs[None],
                                      logits[ids1].softmax(1), dim=1)
            sel = ids1[cos.abs() < 0.05]
        # (sel == ids1 while p_bar is None, as in the authors' code)
        probs = ref_update_model_probs(probs, logits[sel].detach().softmax(1))
        h = ent[sel]
        beta = beta0 * math.exp(-k / gamma)
        l_stag = stag_loss(feats, logits, ref[3].weight, ref[3].bias)
        total = beta * l_stag
        if len(sel):
            base = (h * torch.exp(-(h.detach() - E0))).mean()
            total = base + total
        ref_opt.zero_grad()
        total.backward()
        ref_opt.step()
        _, stats = adapt(method, x)
        assert stats['beta'] == pytest.approx(beta, rel=1e-12)
        assert stats['loss_stag'] == pytest.approx(l_stag.item(), rel=1e-10)
        assert stats['loss'] == pytest.approx(total.item(), rel=1e-10)
        if len(sel):
            assert stats['loss'] == pytest.approx(
                stats['loss_base'] + beta * stats['loss_stag'], rel=1e-12)
        assert_params_equal(model, ref)
    assert method.num_updates == method.t == 3
    assert method.beta == pytest.approx(beta0 * math.exp(-3 / gamma))

    # an empty filter with STAG still updates, with beta_t L_STAG alone
    model = make_model()
    before = copy.deepcopy(model.state_dict())
    ref, ref_opt = sgd_on_norm_params(model)
    method = build(model, fisher_alpha=0, entropy_margin=1e-9,
                   stag=dict(beta0=beta0, gamma=gamma))
    x = batch(5)
    _, stats = adapt(method, x)
    assert stats['num_selected'] == 0
    assert 'loss_base' not in stats
    assert method.num_updates == 1
    _, [(feats, logits)] = FORWARD(ref, x)
    (beta0 * stag_loss(feats, logits, ref[3].weight,
                       ref[3].bias)).backward()
    ref_opt.step()
    assert_params_equal(model, ref)
    assert not torch.equal(model[1].weight, before['1.weight'])


def test_same_seed_same_result():
    def run():
        model = make_model(seed=3)
        method = build(model, d_margin=0.6)
        method.fit_source([Batch(batch(200 + i)) for i in range(2)])
        for k in range(3):
            adapt(method, batch(40 + k))
        return model.state_dict(), method.model_probs

    (a, pa), (b, pb) = run(), run()
    for k in a:
        assert torch.equal(a[k], b[k]), k
    assert torch.equal(pa, pb)


# ---------------------------------------------------------------------------
# Segmentation: every pixel a sample.
@pytest.mark.parametrize('fisher_alpha, d_margin', [(2000.0, 0.7),
                                                    (0.0, 0.4),
                                                    (2000.0, 0.05)])
def test_per_pixel_is_the_authors_code_with_pixels_as_samples(fisher_alpha,
                                                              d_margin):
    """On a per-pixel network, the Fisher information, both filters, p_bar,
    the loss and the parameters after every step equal the authors' code
    run on the same network seen as a per-sample model of its pixels
    (PixelsAsSamples)."""
    net = make_seg_net()
    ref_net, ref_opt = sgd_on_norm_params(net)
    ref = PixelsAsSamples(ref_net)
    method = EATA(optimizer=OPT, fisher_alpha=fisher_alpha,
                  d_margin=d_margin)
    method.configure(net, SEG_ADAPTER)
    fishers = None
    if fisher_alpha:
        source = [seg_images(100 + i) for i in range(3)]
        fishers = ref_fishers(ref, norm_params(ref_net),
                              ['net.1.weight', 'net.1.bias'],
                              [pixels_as_samples(x) for x in source])
        method.fit_source([Batch(x) for x in source])
        assert set(method.fishers) == {'1.weight', '1.bias'}
        for name, (fisher, theta0) in method.fishers.items():
            torch.testing.assert_close(fisher, fishers['net.' + name][0],
                                       rtol=1e-12, atol=1e-15)
            torch.testing.assert_close(theta0, fishers['net.' + name][1])
            assert fisher.abs().sum() > 0
    probs = None
    saw_redundant = False
    selected = []
    for k in range(4):
        x = seg_images(10 + k)
        out_ref, n2, n1, probs, loss = ref_forward_and_adapt_eata(
            pixels_as_samples(x), ref, ref_opt, fishers, E0, probs,
            fisher_alpha, d_margin)
        pred, stats = adapt(method, x)
        assert pred.shape == (2, C, 8, 8)
        torch.testing.assert_close(pixel_rows(pred), out_ref.detach(),
                                   rtol=1e-12, atol=1e-12)
        assert stats['num_reliable'] == n1
        assert stats['num_selected'] == n2
        assert 0 < n1 < x.shape[0] * 64
        saw_redundant |= n2 < n1
        selected.append(n2)
        if n2:
            assert stats['loss'] == pytest.approx(loss.item(), rel=1e-10)
        else:
            assert 'loss' not in stats
        torch.testing.assert_close(method.model_probs, probs, rtol=1e-12,
                                   atol=1e-12)
        assert_params_equal(net, ref_net)
    assert saw_redundant
    assert method.num_samples_update_2 == sum(selected)
    if d_margin == 0.05:
        # few classes: once p_bar exists every reliable pixel is redundant
        # (see the class docstring)
        assert selected[0] > 0 and selected[1:] == [0, 0, 0]
    else:
        assert all(selected)
