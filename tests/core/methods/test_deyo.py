"""DeYO against an independent transcription of the authors' code
(github.com/Jhyun17/DeYO, ``methods/deyo.py`` ``forward_and_adapt_deyo``,
``aug_type='patch'``; ``tests/reference/deyo_reference.py``) on a tiny CNN
in float64, and on a tiny per-pixel network with its pixels as the authors'
samples; the patch shuffle against a loop over the patches."""
import copy
import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from reference.adaptation_testbed import CNN_ADAPTER
from reference.adaptation_testbed import CNN_PROBE as FORWARD
from reference.adaptation_testbed import (OPT, SEG_ADAPTER, SEG_PROBE, C,
                                          PixelsAsSamples, ScriptedAdapter,
                                          adapt, assert_params_equal)
from reference.adaptation_testbed import block_images as batch
from reference.adaptation_testbed import make_cnn as make_model
from reference.adaptation_testbed import (make_seg_net, pixel_rows,
                                          pixels_as_samples,
                                          sgd_on_norm_params)
from reference.deyo_reference import (ref_forward_and_adapt_deyo,
                                      ref_shuffle_patches)
from reference.entropy_reference import softmax_entropy as ref_entropy

from mmseg_stag.core import (Batch, ForwardPass, HeadProbe, STAGLoss,
                             TaskAdapter, build_method)
from mmseg_stag.core.methods.deyo import DeYO, patch_shuffle
from mmseg_stag.core.methods.sar import SAR_AUTHORS_EXCLUDE


def build(model, **kwargs):
    kwargs.setdefault('optimizer', OPT)
    method = DeYO(**kwargs)
    method.configure(model, CNN_ADAPTER)
    return method


# ---------------------------------------------------------------------------
def test_registry_and_defaults():
    assert isinstance(build_method(dict(type='deyo')), DeYO)
    m = DeYO()
    assert m.optimizer_cfg == dict(type='SGD', lr=0.00025, momentum=0.9)
    assert m.trainable_cfg == dict(kind='norm_affine')
    assert (m.deyo_margin, m.reweight_margin, m.plpd_threshold,
            m.patch_len) == (0.5, 0.4, 0.2, 4)
    assert (m.reweight_ent, m.reweight_plpd) == (1.0, 1.0)
    assert m.exclude_regex == SAR_AUTHORS_EXCLUDE
    model = make_model()
    m.configure(model, CNN_ADAPTER)
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
    m.configure(net, TaskAdapter(HeadProbe('fc')))
    assert [n for n, _ in m.params] == ['layer3.1.weight', 'layer3.1.bias']
    assert [n for n, p in net.named_parameters() if p.requires_grad] == \
        ['layer3.1.weight', 'layer3.1.bias']
    net2 = Net()
    m2 = DeYO(exclude_regex=None)
    m2.configure(net2, TaskAdapter(HeadProbe('fc')))
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
    ref, ref_opt = sgd_on_norm_params(model)
    e0 = 0.4 * math.log(C)
    nontrivial = False
    for i in range(3):
        x = batch(10 + i)
        torch.manual_seed(100 + i)
        out, stats = adapt(method, x)
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
    assert method.num_updates == method.t
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
    _, stats = adapt(method, x)
    assert stats['num_reliable'] == int(keep1.sum())
    assert stats['num_selected'] == int(keep2.sum())
    assert 0 < stats['num_selected'] < stats['num_reliable'] < len(x)
    assert stats['loss_base'] == pytest.approx(expected.item(), rel=1e-10)
    # filter 2 is strict: a threshold equal to a sample's PLPD drops it
    j = int(plpd[keep2].argmin())
    thr = plpd[keep2][j].item()
    method = build(make_model(), plpd_threshold=thr)
    torch.manual_seed(5)
    _, stats = adapt(method, x)
    assert stats['num_selected'] == int((plpd > thr).sum()) \
        == int(keep2.sum()) - 1


def test_base_loss_on_a_forward_pass_of_its_own():
    """``base_loss`` works on any batch and forward pass (no adapt call
    around it): the PLPD forward runs on ``batch.inputs`` through the
    method's adapter; ``select``'s mask marks the samples of both
    filters. Without images it raises."""
    model = make_model()
    method = build(model, plpd_threshold=0.0)
    x = batch(10)
    calls = []

    def counting(net, inputs):
        calls.append(inputs.shape[0])
        return FORWARD(net, inputs)

    logits, outs = FORWARD(model, x)
    method.task_adapter = ScriptedAdapter(counting, FORWARD)
    fwd = ForwardPass(logits, outs)
    torch.manual_seed(5)
    loss = method.base_loss(Batch(x), fwd)
    # the same numbers as inside adapt (test_loss_by_hand_on_fixed_inputs)
    other = build(make_model(), plpd_threshold=0.0)
    torch.manual_seed(5)
    _, stats = adapt(other, x)
    assert loss.item() == pytest.approx(stats['loss_base'], rel=1e-12)
    assert fwd.stats['num_reliable'] == stats['num_reliable']
    assert fwd.stats['num_selected'] == stats['num_selected']
    assert calls == [stats['num_reliable']]  # the shuffled reliable images
    torch.manual_seed(5)
    _, _, selected, _ = method.select(Batch(x), outs)
    assert int(selected.sum()) == stats['num_selected']
    assert loss.requires_grad and model[1].weight.grad is None
    method.task_adapter = CNN_ADAPTER
    with pytest.raises(ValueError, match=r'images \[N, C, H, W\]'):
        method.base_loss(Batch(x[:, 0]), ForwardPass(logits, outs))


def test_one_step_changes_exactly_the_norm_affine_params():
    model = make_model()
    before = {n: t.clone() for n, t in model.state_dict().items()}
    method = build(model, plpd_threshold=0.0)
    torch.manual_seed(0)
    adapt(method, batch(10))
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
            adapt(method, batch(20 + i))
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
        out, stats = adapt(method, x)
        assert method.num_updates == 0 and method.t == 0
        assert 'loss' not in stats
        assert stats['num_selected'] == 0
        assert_params_equal(model, ref, tol=0)
        with torch.no_grad():
            torch.testing.assert_close(out, ref(x))
        # with STAG: beta_t L_STAG alone moves the parameters
        model = make_model()
        method = build(model, stag=dict(beta0=10.0, gamma=5.0), **kwargs)
        _, stats = adapt(method, x)
        assert method.num_updates == 1
        assert 'loss_base' not in stats
        assert stats['loss'] == pytest.approx(10.0 * stats['loss_stag'])
        assert not torch.equal(model[1].weight, ref[1].weight)


def test_stag_adds_beta_times_stag_loss_and_nothing_else():
    stag_loss = STAGLoss()
    beta0, gamma = 3.0, 2.0
    model = make_model()
    method = build(model, plpd_threshold=0.0,
                   stag=dict(beta0=beta0, gamma=gamma))
    ref, ref_opt = sgd_on_norm_params(model)
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
        _, stats = adapt(method, x)
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
    assert method.t == 3


# ---------------------------------------------------------------------------
# Segmentation: every pixel a sample.
def image_draws(reliable, num_images, seed):
    """The ``torch.rand`` rows the per-pixel method draws after
    ``torch.manual_seed(seed)``: one per image holding a reliable pixel;
    returns them repeated for each reliable pixel (in pixel order)."""
    image = torch.arange(num_images).repeat_interleave(
        reliable.numel() // num_images)
    shuffled = torch.zeros(num_images, dtype=torch.bool)
    shuffled[image[reliable]] = True
    torch.manual_seed(seed)
    rows = torch.rand(int(shuffled.sum()), 16)
    return rows[(shuffled.cumsum(0) - 1)[image[reliable]]]


@pytest.mark.parametrize('margins', [(0.5, 0.2, 1, 1), (0.5, 0.0, 1, 1),
                                     (0.6, 0.05, True, False),
                                     (0.6, 0.05, 0.0, 0.0)])
def test_per_pixel_is_the_authors_code_with_pixels_as_samples(margins,
                                                              monkeypatch):
    """On a per-pixel network, both filters, PLPD (the shuffled image's
    prediction at the same location), weights, loss, counts and the
    parameters after every step equal the authors' code run on the same
    network seen as a per-sample model of its pixels (PixelsAsSamples).

    The authors draw one patch permutation per sample; a pixel's sample is
    its image, so each pixel gets the permutation the method drew for its
    image: the reference's ``torch.rand`` returns those rows."""
    deyo_margin, plpd_thr, rw_ent, rw_plpd = margins
    net = make_seg_net()
    method = DeYO(optimizer=OPT, deyo_margin=deyo_margin,
                  plpd_threshold=plpd_thr, reweight_ent=rw_ent,
                  reweight_plpd=rw_plpd)
    method.configure(net, SEG_ADAPTER)
    ref_net, ref_opt = sgd_on_norm_params(net)
    ref = PixelsAsSamples(ref_net)
    nontrivial = False
    for i in range(3):
        x = batch(10 + i, n=3, size=8)
        samples = pixels_as_samples(x)
        with torch.no_grad():
            reliable = ref_entropy(ref(samples)) < deyo_margin * math.log(C)
        draws = image_draws(reliable, 3, 100 + i)

        def rand(*size):
            assert size == (len(draws), 16)
            return draws.clone()

        torch.manual_seed(100 + i)
        out, stats = adapt(method, x)
        with monkeypatch.context() as patch:
            patch.setattr(torch, 'rand', rand)
            ref_out, n1, n2, ref_loss = ref_forward_and_adapt_deyo(
                samples, ref, ref_opt, deyo_margin * math.log(C),
                0.4 * math.log(C), plpd_thr, rw_ent, rw_plpd)
        torch.testing.assert_close(pixel_rows(out), ref_out.detach(),
                                   rtol=1e-12, atol=1e-12)
        assert stats['num_reliable'] == n1 == int(reliable.sum())
        assert stats['num_selected'] == n2
        if ref_loss is None:
            assert 'loss' not in stats
        else:
            assert stats['loss_base'] == pytest.approx(ref_loss.item(),
                                                       rel=1e-12)
        nontrivial |= 0 < n2 < n1 < len(samples)
        assert_params_equal(net, ref_net)
    assert method.num_updates == method.t
    assert nontrivial  # both filters filter


def damped(forward):
    """``forward`` with zero logits (uniform: ``H = ln C``, never reliable)
    for the images whose mean exceeds 5 (a patch shuffle keeps an image's
    mean)."""
    def run(model, x):
        _, [(f, z)] = forward(model, x)
        z = z * (x.mean((1, 2, 3)) < 5).to(z.dtype)[:, None, None, None]
        return z, [(f, z)]
    return run


def test_per_pixel_plpd_by_hand_only_images_with_a_reliable_pixel():
    """PLPD per pixel from the definitions: ``p[y] - p'[y]`` with ``p'`` the
    shuffled image's prediction at the same location; only the images
    holding a reliable pixel are shuffled (one permutation each, drawn in
    image order) and forwarded."""
    net = make_seg_net()
    method = DeYO(optimizer=OPT, plpd_threshold=0.0)
    method.configure(net, SEG_ADAPTER)
    forward = damped(SEG_PROBE)
    x = batch(10, n=3, size=8)
    x[1] += 10.0  # image 1: no reliable pixel
    with torch.no_grad():
        p = forward(net, x)[0].softmax(1)
    H = -(p * p.log()).sum(1)
    keep1 = H < 0.5 * math.log(C)
    assert keep1[0].any() and keep1[2].any() and not keep1[1].any()
    torch.manual_seed(5)
    perm = torch.argsort(torch.rand(2, 16), dim=-1)
    shuffled = ref_shuffle_patches(x[[0, 2]], perm)
    with torch.no_grad():
        pp = forward(net, shuffled)[0].softmax(1)  # images 0 and 2
    y = p[[0, 2]].argmax(1, keepdim=True)
    plpd = (p[[0, 2]].gather(1, y) - pp.gather(1, y))[:, 0]  # [2, 8, 8]
    keep2 = keep1[[0, 2]] & (plpd > 0)
    h = H[[0, 2]][keep2]
    w = torch.exp(-(h - 0.4 * math.log(C))) + torch.exp(plpd[keep2])
    expected = (w * h).mean()
    # the shuffle changes some pixels' predictions
    assert (pp.argmax(1, keepdim=True) != y)[keep1[[0, 2]][:, None]].any()
    calls = []

    def counting(model, inputs):
        calls.append(inputs.detach().clone())
        return forward(model, inputs)

    torch.manual_seed(5)
    _, stats = adapt(method, x, forward=counting)
    assert len(calls) == 2 and torch.equal(calls[0], x)
    torch.testing.assert_close(calls[1], shuffled, rtol=0, atol=0)
    assert stats['num_reliable'] == int(keep1.sum())
    assert stats['num_selected'] == int(keep2.sum())
    assert 0 < stats['num_selected'] < stats['num_reliable']
    assert stats['loss_base'] == pytest.approx(expected.item(), rel=1e-10)


def test_per_pixel_crops_are_pixels_too():
    """Sliding-window inference (several head outputs per forward): the
    pixels of all crops are the samples; with crops tiling the image, the
    step equals the whole-image step (the shuffled images' crops are read
    at the same crop and location). Crops of other shapes raise."""
    def crops(model, x):
        pred, [(f, z)] = SEG_PROBE(model, x)
        return pred, [(f[..., :3], z[..., :3]), (f[..., 3:], z[..., 3:])]

    x = batch(10, n=3, size=8)
    nets, all_stats = [], []
    for forward in (SEG_PROBE, crops):
        net = make_seg_net()
        method = DeYO(optimizer=OPT)
        method.configure(net, SEG_ADAPTER)
        torch.manual_seed(5)
        _, stats = adapt(method, x, forward=forward)
        nets.append(net)
        all_stats.append(stats)
    whole, cropped = all_stats
    assert 0 < cropped['num_selected'] < cropped['num_reliable']
    for key in ('num_reliable', 'num_selected'):
        assert cropped[key] == whole[key]
    assert cropped['loss'] == pytest.approx(whole['loss'], rel=1e-12)
    assert_params_equal(*nets)

    calls = []

    def other_crops_when_shuffled(model, inputs):
        calls.append(1)
        return (crops if len(calls) == 1 else SEG_PROBE)(model, inputs)

    net = make_seg_net()
    method = DeYO(optimizer=OPT)
    method.configure(net, SEG_ADAPTER)
    with pytest.raises(ValueError, match='shuffled images gave head outputs'):
        adapt(method, x, forward=other_crops_when_shuffled)
