"""CoTTA against an independent transcription of the authors' code
(github.com/qinenergy/cotta, ``cifar/cotta.py`` ``forward_and_adapt``,
``update_ema_variables``, ``copy_model_and_optimizer``) on a tiny CNN in
float64, and its augmentations (``cifar/my_transforms.py``,
``get_tta_transforms``) against hand computations."""
import copy
import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from mmseg.registry import MODELS

import mmseg_stag  # noqa: F401  (registers STAGLoss)
from mmseg_stag.classification.forward import make_forward
from mmseg_stag.methods import augment as A
from mmseg_stag.methods.cotta import CoTTA
from mmseg_stag.registry import TTA_METHODS

C = 5
LR = 1e-2  # large, so that a wrong update is visible
FORWARD = make_forward('5')


def make_model(seed=1):
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4),
                          nn.ReLU(), nn.AdaptiveAvgPool2d(2), nn.Flatten(),
                          nn.Linear(16, C))
    with torch.no_grad():
        model[0].weight.mul_(10.0)
        model[0].bias.mul_(10.0)
    return model.double().eval()


def batch(seed, n=8, size=16):
    """Images in [0, 1]."""
    return torch.rand(n, 3, size, size, dtype=torch.float64,
                      generator=torch.Generator().manual_seed(seed))


def build(model, **kwargs):
    kwargs.setdefault('optimizer', dict(type='Adam', lr=LR,
                                        betas=(0.9, 0.999)))
    kwargs.setdefault('num_augs', 3)
    method = CoTTA(**kwargs)
    method.configure(model, model[5])
    return method


def anchor_confidence(model, x):
    with torch.no_grad():
        return model(x).softmax(1).max(1)[0].mean(0).item()


# ---------------------------------------------------------------------------
# the authors' code, transcribed
def ref_softmax_entropy(x, x_ema):
    return -(x_ema.softmax(1) * x.log_softmax(1)).sum(1)


def ref_update_ema_variables(ema_model, model, alpha_teacher):
    for ema_param, param in zip(ema_model.parameters(), model.parameters()):
        ema_param.data[:] = alpha_teacher * ema_param[:].data[:] + \
            (1 - alpha_teacher) * param[:].data[:]
    return ema_model


class RefCoTTA:
    """``CoTTA`` of the authors (``steps=1``); ``lazy`` skips the augmented
    forwards when their mean is not used; ``extra(model, x)`` is added to
    the loss."""

    def __init__(self, model, transform, mt, rst, ap, n_augs, lr=LR,
                 lazy=False, extra=None):
        self.model = copy.deepcopy(model)
        params = []
        for nm, m in self.model.named_modules():
            for np_, p in m.named_parameters():
                if np_ in ['weight', 'bias'] and p.requires_grad:
                    params.append(p)
        self.optimizer = torch.optim.Adam(params, lr=lr, betas=(0.9, 0.999))
        self.model_state = copy.deepcopy(self.model.state_dict())
        self.model_anchor = copy.deepcopy(self.model)
        self.model_ema = copy.deepcopy(self.model)
        for param in self.model_ema.parameters():
            param.detach_()
        self.transform, self.mt, self.rst, self.ap = transform, mt, rst, ap
        self.n_augs, self.lazy, self.extra = n_augs, lazy, extra

    def forward_and_adapt(self, x):
        outputs = self.model(x)
        anchor_prob = torch.nn.functional.softmax(self.model_anchor(x),
                                                  dim=1).max(1)[0]
        standard_ema = self.model_ema(x)
        outputs_emas = []
        if not self.lazy or anchor_prob.mean(0) < self.ap:
            for i in range(self.n_augs):
                outputs_ = self.model_ema(self.transform(x)).detach()
                outputs_emas.append(outputs_)
        if anchor_prob.mean(0) < self.ap:
            outputs_ema = torch.stack(outputs_emas).mean(0)
        else:
            outputs_ema = standard_ema
        loss = (ref_softmax_entropy(outputs, outputs_ema)).mean(0)
        if self.extra is not None:
            loss = loss + self.extra(self.model, x)
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad()
        self.model_ema = ref_update_ema_variables(self.model_ema, self.model,
                                                  self.mt)
        for nm, m in self.model.named_modules():
            for npp, p in m.named_parameters():
                if npp in ['weight', 'bias'] and p.requires_grad:
                    mask = (torch.rand(p.shape) < self.rst).double()
                    with torch.no_grad():
                        p.data = self.model_state[f"{nm}.{npp}"] * mask + \
                            p * (1. - mask)
        return outputs_ema, loss


def assert_params_equal(a, b, tol=1e-12):
    pa, pb = list(a.named_parameters()), list(b.named_parameters())
    assert len(pa) == len(pb)
    for (na, ta), (nb, tb) in zip(pa, pb):
        assert na == nb
        torch.testing.assert_close(ta, tb, rtol=tol, atol=tol, msg=na)


# ---------------------------------------------------------------------------
def test_registry_and_defaults():
    for name in ('CoTTA', 'cotta'):
        assert isinstance(TTA_METHODS.build(dict(type=name)), CoTTA)
    m = CoTTA()
    assert m.optimizer_cfg == dict(type='Adam', lr=1e-3, betas=(0.9, 0.999))
    assert m.trainable_cfg == dict(kind='all')
    assert (m.ema_momentum, m.restore_prob, m.ap, m.num_augs) == (
        0.999, 0.01, 0.92, 32)
    assert not m.always_augment
    aug = m.augment
    assert (aug.brightness, aug.contrast, aug.saturation, aug.hue,
            aug.gamma) == ((0.6, 1.4), (0.7, 1.3), (0.5, 1.5),
                           (-0.06, 0.06), (0.7, 1.3))
    assert (aug.degrees, aug.translate, aug.scale, aug.blur_kernel,
            aug.blur_sigma, aug.hflip_prob, aug.noise_std, aug.clip,
            aug.pad_fraction) == ((-15.0, 15.0), (1 / 16, 1 / 16),
                                  (0.9, 1.1), 5, (0.001, 0.5), 0.5, 0.005,
                                  (0.0, 1.0), 0.5)
    soft = CoTTA(augment=dict(soft=True, noise_std=0.01)).augment
    assert soft.brightness == (0.8, 1.2) and soft.degrees == (-8.0, 8.0)
    assert soft.noise_std == 0.01
    model = make_model()
    m.configure(model, model[5])
    assert all(p.requires_grad for p in model.parameters())
    assert not any(p.requires_grad for p in m.teacher.parameters())
    assert not any(p.requires_grad for p in m.anchor.parameters())
    assert m.teacher is not model and m.anchor is not model
    assert [n for n, _ in m.restore_params] == [
        n for n, _ in model.named_parameters()]


@pytest.mark.parametrize('ap', [1.01, 0.0])
def test_matches_authors_code_over_batches(ap):
    """Predictions, loss, student, teacher and anchor equal the authors'
    forward_and_adapt over consecutive batches (always_augment: the same
    random stream as theirs)."""
    model = make_model()
    kwargs = dict(ema_momentum=0.9, restore_prob=0.2, ap=ap, num_augs=3)
    method = build(model, always_augment=True, **kwargs)
    ref = RefCoTTA(model, method.augment, 0.9, 0.2, ap, 3)
    for i in range(3):
        x = batch(10 + i)
        torch.manual_seed(100 + i)
        out = method.adapt(FORWARD, x)
        torch.manual_seed(100 + i)
        ref_out, ref_loss = ref.forward_and_adapt(x)
        torch.testing.assert_close(out, ref_out.detach(), rtol=1e-10,
                                   atol=1e-12)
        assert not out.requires_grad
        assert method.last_stats['augmented'] == float(ap > 1)
        assert method.last_stats['loss_base'] == pytest.approx(
            ref_loss.item(), rel=1e-10)
        assert_params_equal(model, ref.model, tol=1e-10)
        assert_params_equal(method.teacher, ref.model_ema, tol=1e-10)
        assert_params_equal(method.anchor, ref.model_anchor, tol=0)
    assert method.num_updates == 3


def test_lazy_augmentation_matches_authors_outputs():
    """Without always_augment the augmented forwards run only when used;
    with the branch taken every batch the stream is the authors'."""
    model = make_model()
    method = build(model, ema_momentum=0.9, restore_prob=0.2, ap=1.01)
    ref = RefCoTTA(model, method.augment, 0.9, 0.2, 1.01, 3, lazy=True)
    for i in range(2):
        x = batch(20 + i)
        torch.manual_seed(i)
        out = method.adapt(FORWARD, x)
        torch.manual_seed(i)
        ref_out, _ = ref.forward_and_adapt(x)
        torch.testing.assert_close(out, ref_out, rtol=1e-10, atol=1e-12)
        assert_params_equal(model, ref.model, tol=1e-10)
        assert_params_equal(method.teacher, ref.model_ema, tol=1e-10)


def test_augmentation_branch_iff_anchor_confidence_below_ap():
    x = batch(30)
    conf = anchor_confidence(make_model(), x)
    assert 0.2 < conf < 0.99
    # below ap: the mean over num_augs teacher forwards of augmented views
    model = make_model()
    source = copy.deepcopy(model)
    method = build(model, ap=conf + 1e-9, restore_prob=0.0, num_augs=4)
    torch.manual_seed(3)
    out = method.adapt(FORWARD, x)
    assert method.last_stats['augmented'] == 1.0
    assert method.last_stats['anchor_prob'] == pytest.approx(conf)
    torch.manual_seed(3)
    with torch.no_grad():
        views = [source(method.augment(x)) for _ in range(4)]
    torch.testing.assert_close(out, torch.stack(views).mean(0))
    with torch.no_grad():
        assert not torch.allclose(out, source(x))
    # at or above ap: the single-view teacher prediction, no random draw
    model = make_model()
    method = build(model, ap=conf - 1e-9, restore_prob=0.0, num_augs=4)
    state = torch.get_rng_state()
    out = method.adapt(FORWARD, x)
    assert torch.equal(torch.get_rng_state(), state)
    assert method.last_stats['augmented'] == 0.0
    with torch.no_grad():
        torch.testing.assert_close(out, source(x))
    # num_augs=0 disables the augmentations whatever the confidence
    model = make_model()
    method = build(model, ap=2.0, restore_prob=0.0, num_augs=0)
    out = method.adapt(FORWARD, x)
    assert method.last_stats['augmented'] == 0.0
    with torch.no_grad():
        torch.testing.assert_close(out, source(x))


def test_loss_is_cross_entropy_to_the_teacher_and_prediction_is_teachers():
    model = make_model()
    method = build(model, ap=0.0, restore_prob=0.0)
    with torch.no_grad():  # a teacher different from the student
        for p in method.teacher.parameters():
            p.add_(0.3 * torch.randn_like(p))
    teacher = copy.deepcopy(method.teacher)
    student = copy.deepcopy(model)
    x = batch(40)
    out = method.adapt(FORWARD, x)
    with torch.no_grad():
        zt, zs = teacher(x), student(x)
    pt = zt.softmax(1)
    expected = -(pt * torch.log(zs.softmax(1))).sum(1).mean()
    assert method.last_stats['loss_base'] == pytest.approx(expected.item(),
                                                           rel=1e-10)
    assert method.last_stats['loss'] == method.last_stats['loss_base']
    torch.testing.assert_close(out, zt)  # the teacher's, before its update
    with torch.no_grad():
        assert not torch.allclose(out, zs)


@pytest.mark.parametrize('trainable', [None, dict(kind='norm_affine')])
def test_teacher_update_is_alpha_mix(trainable):
    alpha = 0.7
    model = make_model()
    method = build(model, ap=0.0, restore_prob=0.0, ema_momentum=alpha,
                   trainable=trainable)
    with torch.no_grad():
        for p in method.teacher.parameters():
            p.add_(0.3 * torch.randn_like(p))
    teacher_before = copy.deepcopy(method.teacher)
    buffers_before = {n: b.clone() for n, b in method.teacher.named_buffers()}
    student_before = copy.deepcopy(model)
    method.adapt(FORWARD, batch(50))
    changed = [n for (n, p), q in zip(model.named_parameters(),
                                      student_before.parameters())
               if not torch.equal(p, q)]
    if trainable is None:
        assert len(changed) == len(list(model.parameters()))
    else:
        assert changed == ['1.weight', '1.bias']
    for (n, t), t0, s in zip(method.teacher.named_parameters(),
                             teacher_before.parameters(),
                             model.parameters()):
        torch.testing.assert_close(t, alpha * t0 + (1 - alpha) * s,
                                   rtol=1e-14, atol=1e-14, msg=n)
    for n, b in method.teacher.named_buffers():  # buffers: not averaged
        assert torch.equal(b, buffers_before[n]), n


@pytest.mark.parametrize('trainable', [None, dict(kind='norm_affine')])
def test_stochastic_restore_mask_by_hand(trainable):
    """Order of the draws: one torch.rand(p.shape) per trainable weight/bias
    in named_parameters order, after the (here absent) augmentations."""
    rst = 0.3
    model = make_model()
    source = {n: p.detach().clone() for n, p in model.named_parameters()}
    method = build(model, ap=0.0, restore_prob=rst, trainable=trainable,
                   optimizer=dict(type='Adam', lr=0.0))
    with torch.no_grad():  # moved away from the source; lr 0 keeps it
        for p in model.parameters():
            p.add_(1.0)
    moved = {n: p.detach().clone() for n, p in model.named_parameters()}
    torch.manual_seed(9)
    method.adapt(FORWARD, batch(60))
    torch.manual_seed(9)
    restored = ['0.weight', '0.bias', '1.weight', '1.bias', '5.weight',
                '5.bias'] if trainable is None else ['1.weight', '1.bias']
    num_restored = 0
    for n, p in model.named_parameters():
        if n in restored:
            mask = (torch.rand(p.shape) < rst).double()
            expected = source[n] * mask + moved[n] * (1. - mask)
            num_restored += int(mask.sum())
            assert 0 < mask.sum() < mask.numel() or mask.numel() < 8
        else:
            expected = moved[n]
        torch.testing.assert_close(p, expected, rtol=0, atol=0, msg=n)
    assert num_restored > 0
    # restore_prob 0: nothing restored, no draw
    model = make_model()
    method = build(model, ap=0.0, restore_prob=0.0)
    state = torch.get_rng_state()
    method.adapt(FORWARD, batch(60))
    assert torch.equal(torch.get_rng_state(), state)


def test_same_seed_same_results():
    def run(seed):
        model = make_model()
        method = build(model, ap=1.01, restore_prob=0.1, ema_momentum=0.9)
        torch.manual_seed(seed)
        outs = [method.adapt(FORWARD, batch(70 + i)) for i in range(2)]
        return model, method.teacher, outs

    a, b, c = run(0), run(0), run(1)
    assert_params_equal(a[0], b[0], tol=0)
    assert_params_equal(a[1], b[1], tol=0)
    for oa, ob in zip(a[2], b[2]):
        assert torch.equal(oa, ob)
    assert not torch.equal(a[2][0], c[2][0])


def test_stag_adds_beta_times_stag_loss_and_nothing_else():
    stag_loss = MODELS.build(dict(type='STAGLoss'))
    beta0, gamma = 4.0, 3.0
    model = make_model()
    method = build(model, ap=1.01, restore_prob=0.2, ema_momentum=0.9,
                   always_augment=True, stag=dict(beta0=beta0, gamma=gamma))
    step = {'t': 0}
    seen = {}

    def extra(net, x):
        feats = net[:5](x)
        logits = net[5](feats)
        seen['l'] = stag_loss(feats, logits, net[5].weight, net[5].bias)
        return beta0 * math.exp(-step['t'] / gamma) * seen['l']

    ref = RefCoTTA(model, method.augment, 0.9, 0.2, 1.01, 3, extra=extra)
    for t in range(3):
        step['t'] = t
        x = batch(80 + t)
        torch.manual_seed(t)
        out = method.adapt(FORWARD, x)
        torch.manual_seed(t)
        ref_out, ref_loss = ref.forward_and_adapt(x)
        stats = method.last_stats
        beta = beta0 * math.exp(-t / gamma)
        assert stats['beta'] == pytest.approx(beta)
        assert stats['loss_stag'] == pytest.approx(seen['l'].item(),
                                                   rel=1e-10)
        assert stats['loss'] == pytest.approx(ref_loss.item(), rel=1e-10)
        assert stats['loss'] == pytest.approx(
            stats['loss_base'] + beta * stats['loss_stag'], rel=1e-12)
        torch.testing.assert_close(out, ref_out, rtol=1e-10, atol=1e-12)
        assert_params_equal(model, ref.model, tol=1e-10)
        assert_params_equal(method.teacher, ref.model_ema, tol=1e-10)


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


# ---------------------------------------------------------------------------
# augmentations
def test_augment_shape_range_and_identity_settings():
    x = batch(1, n=4, size=12)
    aug = A.CoTTAAugment()
    torch.manual_seed(0)
    for _ in range(5):
        y = aug(x)
        assert y.shape == x.shape and y.dtype == x.dtype
        assert y.min() >= 0 and y.max() <= 1
    assert aug(x.float()).dtype == torch.float32
    # out-of-range inputs are clipped too
    y = aug(3 * x - 1)
    assert y.min() >= 0 and y.max() <= 1
    identity = A.CoTTAAugment(brightness=None, contrast=None,
                              saturation=None, hue=None, gamma=None,
                              degrees=None, translate=None, scale=None,
                              blur_sigma=None, hflip_prob=None,
                              noise_std=None)
    state = torch.get_rng_state()
    assert torch.equal(identity(x), x)
    assert torch.equal(torch.get_rng_state(), state)  # nothing drawn
    # neutral ranges (torchvision's ColorJitter: disabled), zero-width
    # affine/blur/noise ranges: the input up to float error
    neutral = A.CoTTAAugment(brightness=(1, 1), contrast=(1, 1),
                             saturation=(1, 1), hue=(0, 0), gamma=(1, 1),
                             degrees=(0, 0), translate=(0, 0),
                             scale=(1, 1), blur_sigma=(1e-4, 1e-4),
                             hflip_prob=0.0, noise_std=0.0)
    assert neutral.brightness is None and neutral.hue is None
    torch.testing.assert_close(neutral(x), x, rtol=0, atol=1e-12)


def test_color_ops_neutral_factors_and_hand_values():
    x = batch(2, n=3, size=6)
    for fn in (A.adjust_brightness, A.adjust_contrast, A.adjust_saturation,
               A.adjust_gamma):
        torch.testing.assert_close(fn(x, 1.0), x)
    torch.testing.assert_close(A.adjust_hue(x, 0.0), x)
    torch.testing.assert_close(A.hsv_to_rgb(A.rgb_to_hsv(x)), x)
    torch.testing.assert_close(A.adjust_brightness(x, 1.5),
                               (1.5 * x).clamp(0, 1))
    gray = 0.2989 * x[:, 0] + 0.587 * x[:, 1] + 0.114 * x[:, 2]
    mean = gray.mean(dim=(1, 2)).view(-1, 1, 1, 1)
    torch.testing.assert_close(A.adjust_contrast(x, 0.7),
                               (0.7 * x + 0.3 * mean).clamp(0, 1))
    torch.testing.assert_close(A.adjust_saturation(x, 0.0),
                               gray.unsqueeze(1).expand_as(x))
    torch.testing.assert_close(A.adjust_gamma(x, 1.3), x ** 1.3)
    # pure colours: HSV by hand, a third of the wheel turns red into green
    red = torch.tensor([1.0, 0.0, 0.0], dtype=torch.float64).view(1, 3, 1, 1)
    green = torch.tensor([0.0, 1.0, 0.0],
                         dtype=torch.float64).view(1, 3, 1, 1)
    torch.testing.assert_close(A.rgb_to_hsv(red).flatten(),
                               torch.tensor([0.0, 1.0, 1.0],
                                            dtype=torch.float64))
    torch.testing.assert_close(A.adjust_hue(red, 1 / 3), green)
    torch.testing.assert_close(A.adjust_hue(green, -1 / 3), red)
    cyan = torch.tensor([0.0, 0.5, 0.5], dtype=torch.float64).view(1, 3, 1,
                                                                   1)
    torch.testing.assert_close(A.rgb_to_hsv(cyan).flatten(),
                               torch.tensor([0.5, 1.0, 0.5],
                                            dtype=torch.float64))
    with pytest.raises(ValueError):
        A.adjust_hue(x, 0.6)


def test_geometric_ops_by_hand():
    x = batch(3, n=2, size=8)
    # clockwise rotation by 90 degrees (torchvision's affine convention)
    torch.testing.assert_close(A.affine(x, 90.0, (0, 0), 1.0),
                               torch.rot90(x, -1, (-2, -1)))
    torch.testing.assert_close(A.affine(x, 0.0, (0, 0), 1.0), x)
    # an integer shift moves the image, zero fill
    y = A.affine(x, 0.0, (2, -1), 1.0)
    torch.testing.assert_close(y[..., :-1, 2:], x[..., 1:, :-2])
    assert y[..., :2].abs().max() == 0 and y[..., -1, :].abs().max() == 0
    # torchvision's tensor affine, transcribed (_get_inverse_affine_matrix,
    # _gen_affine_grid, _apply_grid_transform with fill 0) on a non-square
    # image: pixel-centre grid about the centre, validity-mask blend
    img = batch(5, n=2, size=12)[..., :9, :]
    h, w = img.shape[-2:]
    angle, (tx, ty), sc = 33.0, (2, -1), 1.07
    rot = math.radians(angle)
    m = [math.cos(rot) / sc, math.sin(rot) / sc, 0.0,
         -math.sin(rot) / sc, math.cos(rot) / sc, 0.0]
    m[2] += m[0] * (-tx) + m[1] * (-ty)
    m[5] += m[3] * (-tx) + m[4] * (-ty)
    theta = torch.tensor(m, dtype=torch.float64).reshape(1, 2, 3)
    base = torch.empty(1, h, w, 3, dtype=torch.float64)
    base[..., 0].copy_(torch.linspace(-w * 0.5 + 0.5, w * 0.5 - 0.5, w))
    base[..., 1].copy_(torch.linspace(-h * 0.5 + 0.5, h * 0.5 - 0.5,
                                      h).unsqueeze(-1))
    base[..., 2].fill_(1)
    rescaled = theta.transpose(1, 2) / torch.tensor([0.5 * w, 0.5 * h],
                                                    dtype=torch.float64)
    grid = base.view(1, h * w, 3).bmm(rescaled).view(1, h, w, 2)
    sampled = F.grid_sample(
        torch.cat((img, torch.ones_like(img[:, :1])), 1),
        grid.expand(2, h, w, 2), mode='bilinear', padding_mode='zeros',
        align_corners=False)
    expected = sampled[:, :3] * sampled[:, 3:]
    torch.testing.assert_close(A.affine(img, angle, (tx, ty), sc), expected)
    # blur: reflect padding and the 2-D kernel outer(k, k)
    k = torch.exp(-0.5 * (torch.arange(-2., 3.,
                                       dtype=torch.float64) / 0.7) ** 2)
    k = k / k.sum()
    k2 = torch.outer(k, k).expand(3, 1, 5, 5)
    expected = F.conv2d(F.pad(x, [2, 2, 2, 2], mode='reflect'), k2,
                        groups=3)
    torch.testing.assert_close(A.gaussian_blur(x, 5, 0.7), expected)
    torch.testing.assert_close(A.gaussian_blur(x, 5, 1e-3), x)
    const = torch.full((1, 3, 6, 6), 0.3, dtype=torch.float64)
    torch.testing.assert_close(A.gaussian_blur(const, 5, 2.0), const)
    assert torch.equal(A.center_crop(F.pad(x, [4, 4, 4, 4]), (8, 8)), x)


def test_augment_pipeline_and_draw_order_by_hand():
    x = batch(4, n=2, size=8)
    aug = A.CoTTAAugment()
    torch.manual_seed(21)
    out = aug(x)
    torch.manual_seed(21)
    y = x.clamp(0, 1)
    order = torch.randperm(5).tolist()
    ranges = [(0.6, 1.4), (0.7, 1.3), (0.5, 1.5), (-0.06, 0.06), (0.7, 1.3)]
    for i in order:
        f = torch.empty(1).uniform_(*ranges[i]).item()
        if i == 0:
            y = (f * y).clamp(0, 1)
        elif i == 1:
            y = A.adjust_contrast(y, f)
        elif i == 2:
            y = A.adjust_saturation(y, f)
        elif i == 3:
            y = A.adjust_hue(y, f)
        else:
            y = y.clamp(1e-8, 1.0) ** f
    y = F.pad(y, [4, 4, 4, 4], mode='replicate')
    angle = torch.empty(1).uniform_(-15, 15).item()
    tx = int(round(torch.empty(1).uniform_(-1.0, 1.0).item()))  # 16 / 16
    ty = int(round(torch.empty(1).uniform_(-1.0, 1.0).item()))
    scale = torch.empty(1).uniform_(0.9, 1.1).item()
    y = A.affine(y, angle, (tx, ty), scale)
    y = A.gaussian_blur(y, 5, torch.empty(1).uniform_(0.001, 0.5).item())
    y = y[..., 4:12, 4:12]
    if torch.rand(1) < 0.5:
        y = y.flip(-1)
    y = (y + torch.randn(y.shape) * 0.005).clamp(0, 1)
    torch.testing.assert_close(out, y)
    # normalised inputs: mapped to [0, 1] and back around the same draws
    mean, std = (0.4, 0.5, 0.6), (0.2, 0.25, 0.3)
    m = torch.tensor(mean, dtype=torch.float64).view(1, 3, 1, 1)
    s = torch.tensor(std, dtype=torch.float64).view(1, 3, 1, 1)
    torch.manual_seed(21)
    out_n = A.CoTTAAugment(mean=mean, std=std)((x - m) / s)
    torch.testing.assert_close(out_n, (out - m) / s)
