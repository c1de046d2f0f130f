"""DeYO against an independent transcription of the authors' code
(github.com/Jhyun17/DeYO, ``methods/deyo.py`` ``forward_and_adapt_deyo``,
``aug_type='patch'``) on a tiny CNN in float64; the patch shuffle against a
loop over the patches."""
import copy
import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from mmseg.registry import MODELS

import mmseg_stag  # noqa: F401  (registers STAGLoss)
from mmseg_stag.classification.forward import make_forward
from mmseg_stag.methods.deyo import DEYO_AUTHORS_EXCLUDE, DeYO, patch_shuffle
from mmseg_stag.registry import TTA_METHODS

C = 5
LR = 0.05  # large, so that a wrong update is visible
OPT = dict(type='SGD', lr=LR, momentum=0.9)
FORWARD = make_forward('5')


def make_model(seed=1):
    """Conv-BN-ReLU, 2x2 average pooling (so that shuffling patches changes
    the prediction), linear classifier (module '5')."""
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4),
                          nn.ReLU(), nn.AdaptiveAvgPool2d(2), nn.Flatten(),
                          nn.Linear(16, C))
    with torch.no_grad():
        # confident enough for 0.5 ln C; the classifier keeps moderate
        # weights (a very peaked W W^T makes STAG's anchors vanish)
        model[0].weight.mul_(20.0)
        model[0].bias.mul_(20.0)
    return model.double().eval()


def batch(seed, n=16, size=16):
    """Images made of constant 4x4 blocks of a 4x4 grid (the patches of
    DeYO's shuffle), so that shuffling often changes the prediction."""
    cells = torch.randn(n, 3, 4, 4, dtype=torch.float64,
                        generator=torch.Generator().manual_seed(seed))
    return cells.repeat_interleave(size // 4, -1).repeat_interleave(
        size // 4, -2)


def build(model, **kwargs):
    kwargs.setdefault('optimizer', OPT)
    method = DeYO(**kwargs)
    method.configure(model, model[5])
    return method


# ---------------------------------------------------------------------------
# the authors' code, transcribed (einops replaced by a loop over patches)
def ref_entropy(x):
    return -(x.softmax(1) * x.log_softmax(1)).sum(1)


def ref_shuffle_patches(x, perm, patch_len=4):
    """Output patch k (grid row k // patch_len, column k % patch_len) is the
    input patch perm[b, k]; one patch at a time."""
    n, _, h, w = x.shape
    ph, pw = h // patch_len, w // patch_len
    out = torch.empty_like(x)
    for b in range(n):
        for k in range(patch_len * patch_len):
            src = int(perm[b, k])
            r, c = divmod(k, patch_len)
            sr, sc = divmod(src, patch_len)
            out[b, :, r * ph:(r + 1) * ph, c * pw:(c + 1) * pw] = \
                x[b, :, sr * ph:(sr + 1) * ph, sc * pw:(sc + 1) * pw]
    return out


def ref_forward_and_adapt_deyo(x, model, optimizer, deyo_margin, margin,
                               plpd_threshold, reweight_ent=1,
                               reweight_plpd=1, patch_len=4,
                               stag_term=None):
    """``forward_and_adapt_deyo``; ``stag_term(model, x)`` (optional)
    returns a loss added to the authors' loss (covering every sample), in
    which case the step happens even when a filter is empty."""
    outputs = model(x)
    optimizer.zero_grad()
    extra = None if stag_term is None else stag_term(model, x)
    entropys = ref_entropy(outputs)
    filter_ids_1 = torch.where(entropys < deyo_margin)
    entropys = entropys[filter_ids_1]
    backward = len(entropys)
    loss = None
    final_backward = 0
    if backward > 0:
        x_prime = x[filter_ids_1].detach()
        perm_idx = torch.argsort(torch.rand(x_prime.shape[0],
                                            patch_len * patch_len), dim=-1)
        x_prime = ref_shuffle_patches(x_prime, perm_idx, patch_len)
        with torch.no_grad():
            outputs_prime = model(x_prime)
        prob_outputs = outputs[filter_ids_1].softmax(1)
        prob_outputs_prime = outputs_prime.softmax(1)
        cls1 = prob_outputs.argmax(dim=1)
        plpd = (torch.gather(prob_outputs, dim=1, index=cls1.reshape(-1, 1))
                - torch.gather(prob_outputs_prime, dim=1,
                               index=cls1.reshape(-1, 1)))
        plpd = plpd.reshape(-1)
        filter_ids_2 = torch.where(plpd > plpd_threshold)
        entropys = entropys[filter_ids_2]
        final_backward = len(entropys)
        if final_backward > 0:
            plpd = plpd[filter_ids_2]
            if reweight_ent or reweight_plpd:
                coeff = (reweight_ent * (1 / (torch.exp(
                    ((entropys.clone().detach()) - margin)))) +
                    reweight_plpd * (1 / (torch.exp(
                        -1. * plpd.clone().detach()))))
                entropys = entropys.mul(coeff)
            loss = entropys.mean(0)
    if extra is not None:
        loss = extra if loss is None else loss + extra
    if loss is not None:
        loss.backward()
        optimizer.step()
    optimizer.zero_grad()
    return outputs, backward, final_backward, loss


def norm_params(model):
    return [model[1].weight, model[1].bias]


def ref_setup(model, momentum=0.9):
    ref = copy.deepcopy(model)
    ref.requires_grad_(False)
    for p in norm_params(ref):
        p.requires_grad_(True)
    return ref, torch.optim.SGD(norm_params(ref), LR, momentum=momentum)


def assert_params_equal(a, b, tol=1e-12):
    for (na, pa), (nb, pb) in zip(a.named_parameters(),
                                  b.named_parameters()):
        assert na == nb
        torch.testing.assert_close(pa, pb, rtol=tol, atol=tol, msg=na)


# ---------------------------------------------------------------------------
def test_registry_and_defaults():
    for name in ('DeYO', 'deyo'):
        assert isinstance(TTA_METHODS.build(dict(type=name)), DeYO)
    m = DeYO()
    assert m.optimizer_cfg == dict(type='SGD', lr=0.00025, momentum=0.9)
    assert m.trainable_cfg == dict(kind='norm_affine')
    assert (m.deyo_margin, m.entropy_margin, m.plpd_threshold,
            m.patch_len) == (0.5, 0.4, 0.2, 4)
    assert (m.reweight_ent, m.reweight_plpd) == (1.0, 1.0)
    assert m.exclude_regex == DEYO_AUTHORS_EXCLUDE
    model = make_model()
    m.configure(model, model[5])
    assert m.ent_margin == pytest.approx(0.5 * math.log(C))
    assert m.margin_e0 == pytest.approx(0.4 * math.log(C))


def test_authors_exclusion_of_last_stage():
    """collect_params of the authors: no layer4 / blocks.9-11 / final
    norm."""

    class Net(nn.Module):

        def __init__(self):
            super().__init__()
            self.layer3 = nn.Sequential(nn.Conv2d(3, 4, 1), nn.BatchNorm2d(4))
            self.layer4 = nn.Sequential(nn.Conv2d(4, 4, 1), nn.BatchNorm2d(4))
            self.norm = nn.LayerNorm(4)
            self.fc = nn.Linear(4, C)

    net = Net()
    m = DeYO()
    m.configure(net, net.fc)
    assert [n for n, _ in m.params] == ['layer3.1.weight', 'layer3.1.bias']
    assert [n for n, p in net.named_parameters() if p.requires_grad] == \
        ['layer3.1.weight', 'layer3.1.bias']
    net2 = Net()
    m2 = DeYO(exclude_regex=None)
    m2.configure(net2, net2.fc)
    assert len(m2.params) == 6


# ---------------------------------------------------------------------------
def test_patch_shuffle_fixed_permutation_by_hand():
    x = torch.arange(2 * 3 * 8 * 8, dtype=torch.float64).reshape(2, 3, 8, 8)
    perm = torch.stack([torch.arange(15, -1, -1),
                        torch.tensor([3, 0, 1, 2, 7, 4, 5, 6, 15, 14, 13, 12,
                                      8, 9, 10, 11])])
    out = patch_shuffle(x, 4, perm=perm)
    torch.testing.assert_close(out, ref_shuffle_patches(x, perm), rtol=0,
                               atol=0)
    # a few blocks by hand: image 0 is reversed, so its top-left 2x2 patch
    # is the input's bottom-right one
    torch.testing.assert_close(out[0, :, :2, :2], x[0, :, 6:, 6:])
    torch.testing.assert_close(out[1, :, :2, :2], x[1, :, :2, 6:])
    torch.testing.assert_close(out[1, :, 6:, :2], x[1, :, 4:6, :2])
    # identity permutation: the input, exactly
    ident = torch.arange(16).expand(2, 16)
    torch.testing.assert_close(patch_shuffle(x, 4, perm=ident), x, rtol=0,
                               atol=0)
    # a patch shuffle only moves values
    assert torch.equal(out.flatten(1).sort(1)[0], x.flatten(1).sort(1)[0])
    # other grid sizes
    perm2 = torch.tensor([[1, 0, 3, 2]])
    torch.testing.assert_close(patch_shuffle(x[:1], 2, perm=perm2),
                               ref_shuffle_patches(x[:1], perm2, 2))


def test_patch_shuffle_resize_when_not_divisible():
    x = torch.rand(2, 3, 10, 9, dtype=torch.float64)
    perm = torch.argsort(torch.rand(2, 16), dim=-1)
    small = F.interpolate(x, size=(8, 8), mode='bilinear',
                          align_corners=False)
    expected = F.interpolate(ref_shuffle_patches(small, perm), size=(10, 9),
                             mode='bilinear', align_corners=False)
    out = patch_shuffle(x, 4, perm=perm)
    assert out.shape == x.shape
    torch.testing.assert_close(out, expected)
    with pytest.raises(ValueError):
        patch_shuffle(torch.rand(1, 3, 3, 3), 4)


def test_patch_shuffle_draw_is_argsort_of_rand():
    x = batch(0, n=3)
    g1 = torch.Generator().manual_seed(7)
    g2 = torch.Generator().manual_seed(7)
    perm = torch.argsort(torch.rand(3, 16, generator=g2), dim=-1)
    torch.testing.assert_close(patch_shuffle(x, 4, generator=g1),
                               ref_shuffle_patches(x, perm))
    # global generator, as the authors
    torch.manual_seed(11)
    out = patch_shuffle(x)
    torch.manual_seed(11)
    perm = torch.argsort(torch.rand(3, 16), dim=-1)
    torch.testing.assert_close(out, ref_shuffle_patches(x, perm))
    assert not torch.equal(out, x)


# ---------------------------------------------------------------------------
@pytest.mark.parametrize('margins', [(0.5, 0.0, 1, 1), (0.5, 0.2, 1, 1),
                                     (0.6, 0.05, True, False),
                                     (0.6, 0.05, 0.0, 0.0),
                                     (0.6, -0.1, 0.5, 2.0)])
def test_matches_authors_code_over_batches(margins):
    """Filters, PLPD, weights, loss, counts and parameters equal the
    authors' forward_and_adapt_deyo over consecutive batches (same seed
    for the patch permutation)."""
    deyo_margin, plpd_thr, rw_ent, rw_plpd = margins
    model = make_model()
    method = build(model, deyo_margin=deyo_margin, plpd_threshold=plpd_thr,
                   reweight_ent=rw_ent, reweight_plpd=rw_plpd)
    ref, ref_opt = ref_setup(model)
    e0 = 0.4 * math.log(C)
    nontrivial = False
    for i in range(3):
        x = batch(10 + i)
        torch.manual_seed(100 + i)
        out = method.adapt(FORWARD, x)
        stats = method.last_stats
        torch.manual_seed(100 + i)
        ref_out, n1, n2, ref_loss = ref_forward_and_adapt_deyo(
            x, ref, ref_opt, deyo_margin * math.log(C), e0, plpd_thr,
            rw_ent, rw_plpd)
        torch.testing.assert_close(out, ref_out.detach(), rtol=1e-12,
                                   atol=1e-12)
        assert not out.requires_grad
        assert stats['num_reliable'] == n1
        assert stats['num_selected'] == n2
        if ref_loss is None:
            assert 'loss' not in stats
        else:
            assert stats['loss_base'] == pytest.approx(ref_loss.item(),
                                                       rel=1e-12)
        nontrivial |= 0 < n2 < n1 < x.shape[0]
        assert_params_equal(model, ref)
    assert method.num_updates == method.step
    if margins[:2] == (0.5, 0.0):
        assert nontrivial  # both filters actually filter in this setting


def test_loss_by_hand_on_fixed_inputs():
    """Entropy filter, PLPD, weights and loss recomputed from the paper's
    definitions (not the authors' code layout)."""
    model = make_model()
    method = build(model, plpd_threshold=0.0)
    x = batch(10)
    with torch.no_grad():
        z = model(x)
    p = z.softmax(1)
    H = -(p * p.log()).sum(1)
    keep1 = H < 0.5 * math.log(C)
    idx1 = keep1.nonzero()[:, 0]
    torch.manual_seed(5)
    perm = torch.argsort(torch.rand(len(idx1), 16), dim=-1)
    with torch.no_grad():
        pp = model(ref_shuffle_patches(x[idx1], perm)).softmax(1)
    y = p[idx1].argmax(1)
    plpd = p[idx1, y] - pp[torch.arange(len(idx1)), y]
    keep2 = plpd > 0.0
    h = H[idx1][keep2]
    w = torch.exp(-(h - 0.4 * math.log(C))) + torch.exp(plpd[keep2])
    expected = (w * h).mean()
    # the shuffle changes some predictions: PLPD is read at the original
    # prediction y, not at the shuffled one
    assert (pp.argmax(1) != y).any()
    torch.manual_seed(5)
    method.adapt(FORWARD, x)
    stats = method.last_stats
    assert stats['num_reliable'] == int(keep1.sum())
    assert stats['num_selected'] == int(keep2.sum())
    assert 0 < stats['num_selected'] < stats['num_reliable'] < len(x)
    assert stats['loss_base'] == pytest.approx(expected.item(), rel=1e-10)
    # filter 2 is strict: a threshold equal to a sample's PLPD drops it
    j = int(plpd[keep2].argmin())
    thr = plpd[keep2][j].item()
    method = build(make_model(), plpd_threshold=thr)
    torch.manual_seed(5)
    method.adapt(FORWARD, x)
    assert method.last_stats['num_selected'] == int((plpd > thr).sum()) \
        == int(keep2.sum()) - 1


def test_one_step_changes_exactly_the_norm_affine_params():
    model = make_model()
    before = {n: t.clone() for n, t in model.state_dict().items()}
    method = build(model, plpd_threshold=0.0)
    torch.manual_seed(0)
    method.adapt(FORWARD, batch(10))
    assert method.num_updates == 1
    after = model.state_dict()
    changed = {n for n in before if not torch.equal(before[n], after[n])}
    assert changed == {'1.weight', '1.bias'}
    assert [n for n, _ in method.params] == ['1.weight', '1.bias']


def test_same_seed_same_parameters():
    def run(seed):
        model = make_model()
        method = build(model, plpd_threshold=0.0)
        torch.manual_seed(seed)
        for i in range(3):
            method.adapt(FORWARD, batch(20 + i))
        return model

    a, b, c = run(0), run(0), run(1)
    assert_params_equal(a, b, tol=0)
    assert any(not torch.equal(pa, pc)
               for pa, pc in zip(a.parameters(), c.parameters()))


def test_empty_filters_no_update_without_stag_update_with_stag():
    x = batch(10)
    # filter 1 empty (tiny margin); filter 2 empty (PLPD <= 1 < 1.5)
    for kwargs in (dict(deyo_margin=1e-6), dict(plpd_threshold=1.5)):
        model = make_model()
        ref = copy.deepcopy(model)
        method = build(model, **kwargs)
        out = method.adapt(FORWARD, x)
        assert method.num_updates == 0 and method.step == 0
        assert 'loss' not in method.last_stats
        assert method.last_stats['num_selected'] == 0
        assert_params_equal(model, ref, tol=0)
        with torch.no_grad():
            torch.testing.assert_close(out, ref(x))
        # with STAG: beta_t L_STAG alone moves the parameters
        model = make_model()
        method = build(model, stag=dict(beta0=10.0, gamma=5.0), **kwargs)
        method.adapt(FORWARD, x)
        assert method.num_updates == 1
        assert 'loss_base' not in method.last_stats
        assert method.last_stats['loss'] == pytest.approx(
            10.0 * method.last_stats['loss_stag'])
        assert not torch.equal(model[1].weight, ref[1].weight)


def test_stag_adds_beta_times_stag_loss_and_nothing_else():
    stag_loss = MODELS.build(dict(type='STAGLoss'))
    beta0, gamma = 3.0, 2.0
    model = make_model()
    method = build(model, plpd_threshold=0.0,
                   stag=dict(beta0=beta0, gamma=gamma))
    ref, ref_opt = ref_setup(model)
    for t in range(3):
        x = batch(30 + t)
        beta = beta0 * math.exp(-t / gamma)
        seen = {}

        def stag_term(net, inp):
            feats = net[:5](inp)
            logits = net[5](feats)
            seen['l'] = stag_loss(feats, logits, net[5].weight, net[5].bias)
            return beta * seen['l']

        torch.manual_seed(t)
        method.adapt(FORWARD, x)
        stats = method.last_stats
        torch.manual_seed(t)
        _, _, n2, ref_loss = ref_forward_and_adapt_deyo(
            x, ref, ref_opt, 0.5 * math.log(C), 0.4 * math.log(C), 0.0,
            stag_term=stag_term)
        assert stats['beta'] == pytest.approx(beta)
        assert stats['loss_stag'] == pytest.approx(seen['l'].item(),
                                                   rel=1e-10)
        assert stats['loss'] == pytest.approx(ref_loss.item(), rel=1e-10)
        assert stats['loss'] == pytest.approx(
            stats.get('loss_base', 0.0) + beta * stats['loss_stag'],
            rel=1e-12)
        assert_params_equal(model, ref)
    assert method.step == 3


def test_per_pixel_outputs_rejected():
    model = make_model()
    method = build(model)

    def seg_forward(net, x):
        logits = torch.randn(x.shape[0], C, 4, 4, dtype=x.dtype,
                             requires_grad=True)
        feats = torch.randn(x.shape[0], 16, 4, 4, dtype=x.dtype)
        return logits, [(feats, logits)]

    with pytest.raises(ValueError, match='per-sample classification'):
        method.adapt(seg_forward, batch(0))


def test_base_loss_outside_adapt_raises():
    model = make_model()
    method = build(model)
    with pytest.raises(RuntimeError, match='adapt'):
        method.base_loss(FORWARD(model, batch(0))[1])
