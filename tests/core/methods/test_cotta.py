"""CoTTA against an independent transcription of the authors' code
(github.com/qinenergy/cotta, ``cifar/cotta.py`` ``forward_and_adapt``,
``update_ema_variables``, ``copy_model_and_optimizer``, and
``imagenet/cotta.py``'s symmetric loss and ``forward_and_adapt``;
``tests/reference/cotta_reference.py``) on a tiny CNN in float64."""
import copy
import math

import pytest
import torch
from reference.adaptation_testbed import (CNN_ADAPTER, SEG_ADAPTER, C, adapt,
                                          assert_params_equal, make_cnn)
from reference.adaptation_testbed import unit_images as batch
from reference.cotta_reference import (RefCoTTA, RefCoTTAImageNet,
                                       ref_softmax_entropy,
                                       ref_symmetric_softmax_entropy)

from mmseg_stag.core import (Batch, Logits, PassStats, STAGLoss, build_method,
                             use_batch_statistics)
from mmseg_stag.core.losses import (cross_entropy_to_teacher,
                                    symmetric_cross_entropy)
from mmseg_stag.core.methods.cotta import CoTTA

LR = 1e-2  # large, so that a wrong update is visible


def make_model(seed=1):
    return make_cnn(seed, scale=10.0)


def build(model, **kwargs):
    kwargs.setdefault('optimizer', dict(type='Adam', lr=LR,
                                        betas=(0.9, 0.999)))
    kwargs.setdefault('num_augs', 3)
    method = CoTTA(**kwargs)
    method.configure(model, CNN_ADAPTER)
    return method


def reference(model, transform, mt, rst, ap, n_augs, **kwargs):
    """The authors' CoTTA on a copy of ``model`` (Adam, lr ``LR``)."""
    return RefCoTTA(model, transform, mt, rst, ap, n_augs, LR, **kwargs)


def anchor_confidence(model, x):
    with torch.no_grad():
        return model(x).softmax(1).max(1)[0].mean(0).item()


# ---------------------------------------------------------------------------
def test_registry_and_defaults():
    assert isinstance(build_method(dict(type='cotta')), CoTTA)
    m = CoTTA()
    assert m.optimizer_cfg == dict(type='Adam', lr=1e-3, betas=(0.9, 0.999))
    assert m.trainable_cfg == dict(kind='all')
    assert (m.ema_momentum, m.restore_prob, m.ap, m.num_augs) == (
        0.999, 0.01, 0.92, 32)
    assert not m.always_augment
    assert m.loss_type == 'ce'  # the CIFAR code's loss
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
    m.configure(model, CNN_ADAPTER)
    assert all(p.requires_grad for p in model.parameters())
    assert not any(p.requires_grad for p in m.teacher.parameters())
    assert not any(p.requires_grad for p in m.source_model.parameters())
    assert m.teacher is not model and m.source_model is not model
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
    ref = reference(model, method.augment, 0.9, 0.2, ap, 3)
    for i in range(3):
        x = batch(10 + i)
        torch.manual_seed(100 + i)
        out, stats = adapt(method, x)
        torch.manual_seed(100 + i)
        ref_out, ref_loss = ref.forward_and_adapt(x)
        torch.testing.assert_close(out, ref_out.detach(), rtol=1e-10,
                                   atol=1e-12)
        assert not out.requires_grad
        assert stats['augmented'] == float(ap > 1)
        assert stats['loss_base'] == pytest.approx(
            ref_loss.item(), rel=1e-10)
        assert_params_equal(model, ref.model, tol=1e-10)
        assert_params_equal(method.teacher, ref.model_ema, tol=1e-10)
        assert_params_equal(method.source_model, ref.model_anchor, tol=0)
    assert method.num_updates == 3


def test_lazy_augmentation_matches_authors_outputs():
    """Without always_augment the augmented forwards run only when used;
    with the branch taken every batch the stream is the authors'."""
    model = make_model()
    method = build(model, ema_momentum=0.9, restore_prob=0.2, ap=1.01)
    ref = reference(model, method.augment, 0.9, 0.2, 1.01, 3, lazy=True)
    for i in range(2):
        x = batch(20 + i)
        torch.manual_seed(i)
        out, _ = adapt(method, x)
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
    out, stats = adapt(method, x)
    assert stats['augmented'] == 1.0
    assert stats["source_prob"] == pytest.approx(conf)
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
    out, stats = adapt(method, x)
    assert torch.equal(torch.get_rng_state(), state)
    assert stats['augmented'] == 0.0
    with torch.no_grad():
        torch.testing.assert_close(out, source(x))
    # num_augs=0 disables the augmentations whatever the confidence
    model = make_model()
    method = build(model, ap=2.0, restore_prob=0.0, num_augs=0)
    out, stats = adapt(method, x)
    assert stats['augmented'] == 0.0
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
    out, stats = adapt(method, x)
    with torch.no_grad():
        zt, zs = teacher(x), student(x)
    pt = zt.softmax(1)
    expected = -(pt * torch.log(zs.softmax(1))).sum(1).mean()
    assert stats['loss_base'] == pytest.approx(expected.item(), rel=1e-10)
    assert stats['loss'] == stats['loss_base']
    torch.testing.assert_close(out, zt)  # the teacher's, before its update
    with torch.no_grad():
        assert not torch.allclose(out, zs)


def test_cross_entropy_to_teacher_is_the_authors_softmax_entropy():
    gen = torch.Generator().manual_seed(0)
    x, x_ema = torch.randn(2, 6, C, dtype=torch.float64, generator=gen)
    torch.testing.assert_close(cross_entropy_to_teacher(x, x_ema),
                               ref_softmax_entropy(x, x_ema), rtol=1e-15,
                               atol=1e-15)


def test_symmetric_cross_entropy_is_the_authors_imagenet_softmax_entropy():
    gen = torch.Generator().manual_seed(1)
    x, x_ema = torch.randn(2, 6, C, dtype=torch.float64, generator=gen)
    torch.testing.assert_close(symmetric_cross_entropy(x, x_ema),
                               ref_symmetric_softmax_entropy(x, x_ema),
                               rtol=1e-15, atol=1e-15)
    # the student's gradient with a detached teacher, as both use it
    ours, theirs = x.clone().requires_grad_(), x.clone().requires_grad_()
    symmetric_cross_entropy(ours, x_ema).mean().backward()
    ref_symmetric_softmax_entropy(theirs, x_ema).mean().backward()
    torch.testing.assert_close(ours.grad, theirs.grad, rtol=1e-15,
                               atol=1e-15)
    # not the one-sided loss of the CIFAR code
    assert not torch.allclose(symmetric_cross_entropy(x, x_ema),
                              cross_entropy_to_teacher(x, x_ema))


def test_unknown_loss_is_refused():
    with pytest.raises(ValueError, match='cotta loss must be one of'):
        CoTTA(loss='entropy')


@pytest.mark.parametrize('ap', [1.01, 0.0])
def test_symmetric_loss_matches_authors_imagenet_code_over_batches(ap):
    """``loss='symmetric_ce'`` equals the authors' ImageNet
    ``forward_and_adapt`` (their lazy augmentations are our default; their
    SGD, momentum 0.9, Nesterov) over consecutive batches; their teacher's
    ``train()`` changes nothing on a model normalising with batch
    statistics, as their ``configure_model`` leaves it."""
    model = make_model()
    use_batch_statistics(model)
    kwargs = dict(ema_momentum=0.9, restore_prob=0.2, ap=ap, num_augs=3)
    sgd = dict(lr=LR, momentum=0.9, dampening=0, nesterov=True)
    method = build(model, loss='symmetric_ce',
                   optimizer=dict(type='SGD', **sgd), **kwargs)
    ref = RefCoTTAImageNet(model, method.augment, 0.9, 0.2, ap, 3, LR,
                           optim=lambda p: torch.optim.SGD(p, **sgd))
    for i in range(3):
        x = batch(10 + i)
        torch.manual_seed(100 + i)
        out, stats = adapt(method, x)
        torch.manual_seed(100 + i)
        ref_out, ref_loss = ref.forward_and_adapt(x)
        torch.testing.assert_close(out, ref_out.detach(), rtol=1e-10,
                                   atol=1e-12)
        assert stats['augmented'] == float(ap > 1)
        assert stats['loss_base'] == pytest.approx(ref_loss.item(),
                                                   rel=1e-10)
        assert_params_equal(model, ref.model, tol=1e-10)
        assert_params_equal(method.teacher, ref.model_ema, tol=1e-10)
        assert_params_equal(method.source_model, ref.model_anchor, tol=0)
    assert method.num_updates == 3


def test_symmetric_and_one_sided_losses_differ_on_a_different_teacher():
    """The option changes the loss (and so the update) once the teacher
    differs from the student (SGD: Adam's first step is about lr times the
    gradient's sign whatever the loss)."""
    x = batch(40)
    losses, students = {}, {}
    for loss in ('ce', 'symmetric_ce'):
        model = make_model()
        method = build(model, ap=0.0, restore_prob=0.0, loss=loss,
                       optimizer=dict(type='SGD', lr=LR))
        torch.manual_seed(0)
        with torch.no_grad():  # the same teacher, different from the student
            for p in method.teacher.parameters():
                p.add_(0.3 * torch.randn_like(p))
            zt, zs = method.teacher(x), model(x)
        _, stats = adapt(method, x)
        losses[loss] = stats['loss_base']
        students[loss] = model
        expected = dict(ce=ref_softmax_entropy,
                        symmetric_ce=ref_symmetric_softmax_entropy)[loss]
        assert losses[loss] == pytest.approx(
            expected(zs, zt).mean().item(), rel=1e-12)
    assert losses['ce'] != pytest.approx(losses['symmetric_ce'], rel=1e-3)
    assert not torch.allclose(students['ce'][5].weight,
                              students['symmetric_ce'][5].weight)


def test_teacher_prediction_and_loss_to_teacher_on_their_own():
    """``teacher_prediction`` runs the teacher (and anchor) itself and
    returns the teacher's logits; ``loss_to_teacher`` is the student's loss
    to them; nothing is updated."""
    model = make_model()
    method = build(model, ap=0.0, restore_prob=0.0)
    with torch.no_grad():  # a teacher different from the student
        for p in method.teacher.parameters():
            p.add_(0.3 * torch.randn_like(p))
    teacher = copy.deepcopy(method.teacher)
    student = copy.deepcopy(model)
    x = batch(40)
    one = Batch(x)
    fwd = method.task_adapter.forward(method.model, one)
    stats = PassStats()
    prediction = method.teacher_prediction(one, stats)
    loss = method.loss_to_teacher(fwd, prediction)
    with torch.no_grad():
        zt = teacher(x)
    assert isinstance(prediction, Logits)
    torch.testing.assert_close(prediction.value, zt)
    assert not prediction.value.requires_grad
    torch.testing.assert_close(
        loss, cross_entropy_to_teacher(fwd.output, zt).mean(), rtol=1e-12,
        atol=1e-12)
    assert loss.requires_grad
    assert stats.extra['augmented'] == 0.0 and 'source_prob' in stats.extra
    assert_params_equal(model, student, tol=0)
    assert_params_equal(method.teacher, teacher, tol=0)


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
    adapt(method, batch(50))
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
    adapt(method, batch(60))
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
    adapt(method, batch(60))
    assert torch.equal(torch.get_rng_state(), state)


def test_same_seed_same_results():
    def run(seed):
        model = make_model()
        method = build(model, ap=1.01, restore_prob=0.1, ema_momentum=0.9)
        torch.manual_seed(seed)
        outs = [adapt(method, batch(70 + i))[0] for i in range(2)]
        return model, method.teacher, outs

    a, b, c = run(0), run(0), run(1)
    assert_params_equal(a[0], b[0], tol=0)
    assert_params_equal(a[1], b[1], tol=0)
    for oa, ob in zip(a[2], b[2]):
        assert torch.equal(oa, ob)
    assert not torch.equal(a[2][0], c[2][0])


def test_stag_adds_beta_times_stag_loss_and_nothing_else():
    stag_loss = STAGLoss()
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

    ref = reference(model, method.augment, 0.9, 0.2, 1.01, 3, extra=extra)
    for t in range(3):
        step['t'] = t
        x = batch(80 + t)
        torch.manual_seed(t)
        out, stats = adapt(method, x)
        torch.manual_seed(t)
        ref_out, ref_loss = ref.forward_and_adapt(x)
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


def test_core_cotta_is_per_sample():
    """CoTTA per pixel (the authors' ACDC code) is the segmentation
    package's ``SegmentationCoTTA`` (tests/segmentation/methods)."""
    with pytest.raises(ValueError, match='per_sample outputs only'):
        CoTTA().check_supports(SEG_ADAPTER)


def test_teacher_update_is_bit_equal_to_the_per_tensor_loop():
    """The ``_foreach`` EMA rounds exactly as ``a * ema + (1 - a) * p``
    per tensor (the authors' update_ema_variables), in float32 too."""
    model = make_model().float()
    method = build(model, ap=0.0, restore_prob=0.0, ema_momentum=0.999)
    with torch.no_grad():
        for p in method.teacher.parameters():
            p.add_(0.3 * torch.randn_like(p))
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    expected = [0.999 * t + (1 - 0.999) * p for t, p in zip(
        method.teacher.parameters(), model.parameters())]
    method.update_teacher()
    for t, e in zip(method.teacher.parameters(), expected):
        assert torch.equal(t, e)


def test_restore_on_device_draws_once_and_restores_exactly():
    """``restore_on_device``: one draw for all tensors; each element is
    either its value or its source value exactly, at about the rate."""
    rst = 0.3
    model = make_model()
    source = {n: p.detach().clone() for n, p in model.named_parameters()}
    method = build(model, ap=0.0, restore_prob=rst, restore_on_device=True,
                   optimizer=dict(type='Adam', lr=0.0))
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    moved = {n: p.detach().clone() for n, p in model.named_parameters()}
    torch.manual_seed(9)
    method.stochastic_restore()
    total = sum(p.numel() for p in model.parameters())
    draw = torch.rand(total, generator=torch.Generator().manual_seed(9))
    expected_mask = (draw < rst).split([p.numel()
                                        for p in model.parameters()])
    restored = 0
    for (n, p), mask in zip(model.named_parameters(), expected_mask):
        mask = mask.view_as(p)
        assert torch.equal(p, torch.where(mask, source[n], moved[n])), n
        restored += int(mask.sum())
    assert 0.15 < restored / total < 0.45
    assert 'restore_on_device=True' in repr(method)
