"""``BaseMethod`` through Source, BN Adapt and TENT on a tiny per-pixel
model (a 1x1-conv classifier read by a per-pixel ``HeadProbe``), without any
MMSeg segmentor."""
import copy
import math

import pytest
import torch
import torch.nn as nn
from reference.adaptation_testbed import adapt
from tiny_nets import TinySegNet

from mmseg_stag.core import (METHODS, TENT, Batch, BNAdapt, ForwardPass,
                             HeadProbe, Source, TaskAdapter, build_method,
                             select_parameters, stag)

FORWARD = HeadProbe('classifier', prediction_kind='per_pixel')
ADAPTER = TaskAdapter(FORWARD)


def make_model(seed=0):
    torch.manual_seed(seed)
    model = TinySegNet()
    # non-trivial running statistics, as a trained source model has
    model.body[1].running_mean.uniform_(-0.5, 0.5)
    model.body[1].running_var.uniform_(0.5, 2.0)
    return model.eval()


def images(seed=1, n=2):
    return torch.randn(n, 3, 6, 7,
                       generator=torch.Generator().manual_seed(seed))


def configured(method, model):
    method.configure(model, ADAPTER)
    return method


def features_and_logits(model, x):
    """The head's input and output, computed directly (no probe)."""
    feats = model.body(x)
    return feats, model.classifier(feats)


def test_registry_names():
    for name, cls in (('source', Source), ('bn_adapt', BNAdapt),
                      ('tent', TENT)):
        assert isinstance(METHODS.build(dict(type=name)), cls)
        assert isinstance(build_method(dict(type=name)), cls)
    # the old capitalised names are gone
    for old in ('Source', 'TENT', 'BNAdapt', 'EATA', 'SAR', 'DeYO', 'CoTTA'):
        with pytest.raises(KeyError, match='unknown method'):
            build_method(dict(type=old))
    with pytest.raises(ValueError, match='type'):
        build_method(dict(stag=None))
    tent = build_method(dict(type='tent', loss='pseudo_ce'))
    assert tent.loss_type == 'pseudo_ce' and callable(tent.loss)


def test_source_changes_nothing_and_never_backprops():
    model = make_model()
    before = copy.deepcopy(model.state_dict())
    method = configured(Source(), model)
    assert not method.has_loss
    x = images()
    with torch.no_grad():
        expected = model(x)
    for _ in range(3):
        out, stats = adapt(method, x)
        torch.testing.assert_close(out, expected)
        assert not out.requires_grad and stats == {}
    assert model.forwards == 4
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]), k
    assert all(not p.requires_grad for p in model.parameters())
    with pytest.raises(ValueError, match='stag'):
        Source(stag=dict(beta0=1, gamma=1))


def test_tent_updates_only_norm_affine_params_one_forward_one_backward():
    model = make_model()
    before = {k: v.clone() for k, v in model.named_parameters()}
    method = configured(TENT(optimizer=dict(type='SGD', lr=0.1)), model)
    selected = {n for n, _ in method.params}
    assert selected == {'body.1.weight', 'body.1.bias', 'body.4.weight',
                        'body.4.bias'}
    x = images()
    with torch.no_grad():
        unadapted = copy.deepcopy(model)(x)
    first, _ = adapt(method, x)
    # predict-then-adapt: the first prediction is the unadapted model's
    torch.testing.assert_close(first, unadapted)
    assert model.forwards == 1
    for name, p in model.named_parameters():
        changed = not torch.equal(p, before[name])
        assert changed == (name in selected), name
    # BatchNorm kept its running statistics (eval mode)
    assert model.body[1].running_mean is not None
    assert not model.body[1].training
    _, stats = adapt(method, x)
    assert model.forwards == 2 and method.num_updates == 2
    assert stats['loss'] == pytest.approx(stats['loss_base'])


def test_one_backward_per_batch_counted_through_autograd():
    model = make_model()
    method = configured(
        TENT(stag=dict(beta0=5.0, gamma=3.0),
             optimizer=dict(type='SGD', lr=0.1)), model)
    calls = []
    for _, p in method.params:
        p.register_hook(lambda g, calls=calls: calls.append(1))
    x = images()
    for step in range(3):
        adapt(method, x)
        # every selected tensor receives exactly one gradient per step
        assert len(calls) == len(method.params) * (step + 1)
    assert model.forwards == 3


def test_the_caller_sets_the_grad_mode_and_modes_are_set_once():
    """``adapt`` neither enables gradients (an updating method under
    ``no_grad`` cannot backpropagate) nor resets the layers' modes (set
    once by ``configure``)."""
    model = make_model()
    method = configured(TENT(optimizer=dict(type='SGD', lr=0.1)), model)
    before = {n: p.detach().clone() for n, p in method.params}
    with torch.no_grad():
        with pytest.raises(RuntimeError):
            method.adapt(Batch(images()))
    for n, p in method.params:
        assert torch.equal(p, before[n]), n
    assert not model.training
    model.body[1].train()  # the caller's choice after configure stays
    adapt(method, images())
    assert model.body[1].training and not model.body[4].training


def sgd_update(method_factory, x):
    model = make_model()
    method = configured(method_factory(), model)
    before = {n: p.detach().clone() for n, p in method.params}
    adapt(method, x)
    return {n: p.detach() - before[n] for n, p in method.params}, model


def test_stag_adds_exactly_beta_times_stag_loss_gradient():
    x = images()
    lr, beta0, gamma = 0.05, 7.0, 4.0
    opt = dict(type='SGD', lr=lr)
    plain, _ = sgd_update(lambda: TENT(optimizer=opt), x)
    with_stag, _ = sgd_update(
        lambda: TENT(optimizer=opt, stag=dict(beta0=beta0, gamma=gamma)), x)
    # independent L_STAG gradient on a fresh copy of the model
    model = make_model()
    params = dict(select_parameters(model))
    feats, logits = features_and_logits(model, x)
    l_stag = stag.stag_loss(feats, logits, model.classifier.weight,
                            model.classifier.bias)
    grads = torch.autograd.grad(l_stag, list(params.values()))
    assert any(g.abs().sum() > 0 for g in grads)
    for (name, _), grad in zip(params.items(), grads):
        torch.testing.assert_close(with_stag[name] - plain[name],
                                   -lr * beta0 * grad, rtol=1e-4, atol=1e-7)
    assert not all(torch.equal(plain[n], with_stag[n]) for n in plain)


def test_stag_options_reach_the_loss_and_retired_ones_are_refused():
    """The ``stag`` config's loss options reach ``STAGLoss`` (the method's
    default: no finiteness check); an option retired from the loss (issue
    59) is refused when the method is built, not ignored."""
    method = TENT(stag=dict(beta0=1.0, gamma=2.0, eps=1e-3, anchor='full',
                            label='soft', check_finite=True))
    loss = method.stag_loss
    assert (loss.eps, loss.anchor, loss.label, loss.check_finite) == (
        1e-3, 'full', 'soft', True)
    assert not TENT(stag=dict(beta0=1.0, gamma=2.0)).stag_loss.check_finite
    for retired in ('analytic_backward', 'compile', 'triton', 'norm_tap'):
        with pytest.raises(TypeError, match=retired):
            TENT(stag=dict(beta0=1.0, gamma=2.0, **{retired: True}))


def test_beta_decays_per_update_and_optional_restart_per_stage():
    model = make_model()
    method = configured(TENT(stag=dict(beta0=10.0, gamma=2.0)), model)
    x = images()
    betas = []
    for _ in range(3):
        _, stats = adapt(method, x)
        betas.append(stats['beta'])
    assert betas == pytest.approx([10.0 * math.exp(-t / 2.0)
                                   for t in range(3)])

    model = make_model()
    method = configured(
        TENT(stag=dict(beta0=10.0, gamma=2.0), stage_restart='beta_t'),
        model)
    seen = []
    for stage in (0, 0, 1, 1):
        method.start_stage(stage)
        _, stats = adapt(method, x)
        seen.append(stats['beta'])
    assert seen == pytest.approx([10.0, 10.0 * math.exp(-0.5)] * 2)


def test_pseudo_ce_loss_is_cross_entropy_to_own_argmax():
    model = make_model()
    method = configured(TENT(loss='pseudo_ce'), model)
    x = images()
    logits, outs = FORWARD(model, x)
    expected = nn.functional.cross_entropy(logits, logits.argmax(1))
    torch.testing.assert_close(
        method.base_loss(Batch(x), ForwardPass(logits, outs)),
        expected)
    with pytest.raises(ValueError, match='tent loss'):
        TENT(loss='kl')


def test_repr_shows_the_base_options_then_the_repr_fields():
    """One ``repr`` scheme: the base options, then a method's
    ``repr_fields`` (TENT's loss)."""
    text = repr(TENT(loss='pseudo_ce', stage_restart=['optimizer'],
                     bn_batch_stats=True))
    assert text.startswith("TENT(stag=off, optimizer={'type': 'Adam'")
    assert text.endswith(", stage_restart=('optimizer',), bn_batch_stats="
                         "True, loss_type='pseudo_ce')")


def test_full_resolution_loss_needs_the_original_size():
    """CoTTA's ACDC TENT loss needs labels at each image's original size:
    a task without them is refused at configure, saying so and leaving the
    model alone (tests/segmentation/methods: the loss)."""
    method = TENT(loss='pseudo_ce_fullres')
    assert method.needs_original_size and not TENT().needs_original_size
    model = make_model()
    with pytest.raises(ValueError, match=r"TENT as configured needs logits, "
                       r"labels and a loss at each image's original size "
                       r'\(the segmentation task\), which TaskAdapter does '
                       'not give'):
        method.configure(model, ADAPTER)
    assert method.model is None and method.optimizer is None


STAG_CFG = dict(beta0=10.0, gamma=2.0)


def test_stage_restart_is_refused_where_it_cannot_act_and_old_names_too():
    """``stage_restart`` takes 'optimizer' and 'beta_t' where they act; the
    options it replaced, and the loop's ``bn_batch_stats``, are refused
    with their new spelling."""
    with pytest.raises(ValueError, match=r"stage_restart names \['beta'\]"):
        TENT(stag=STAG_CFG, stage_restart=('beta', ))
    with pytest.raises(ValueError, match="no beta_t without stag"):
        TENT(stage_restart=('beta_t', ))
    with pytest.raises(ValueError, match='makes no update'):
        BNAdapt(stage_restart=('optimizer', ))
    assert BNAdapt(stag=STAG_CFG, stage_restart=['beta_t', 'optimizer']
                   ).stage_restart == ('optimizer', 'beta_t')
    with pytest.raises(ValueError, match=r"fresh_optimizer_per_stage is now "
                       r"stage_restart=\('optimizer', ...\)"):
        build_method(dict(type='tent', fresh_optimizer_per_stage=True))
    with pytest.raises(ValueError, match=r"stag.restart_beta_per_stage is "
                       r"now stage_restart=\(..., 'beta_t'\)"):
        build_method(dict(type='tent', stag=dict(
            STAG_CFG, restart_beta_per_stage=True)))
    with pytest.raises(ValueError, match='bn_batch_stats=False is the '
                       'source model'):
        BNAdapt(bn_batch_stats=False)


def test_bn_batch_stats_is_the_methods_and_reaches_its_copies():
    """``bn_batch_stats=True``: BatchNorm without running statistics, set
    in ``configure`` before a method copies the model (CoTTA's teacher)."""
    per_sample = TaskAdapter(HeadProbe('classifier',
                                       prediction_kind='per_sample'))
    torch.manual_seed(0)
    classifier = nn.Module()  # body[1] a BatchNorm, as TinySegNet's
    classifier.body = nn.Sequential(nn.Conv2d(3, 4, 1), nn.BatchNorm2d(4),
                                    nn.AdaptiveAvgPool2d(1), nn.Flatten())
    classifier.classifier = nn.Linear(4, 3)
    for method, adapter, model in (
            (BNAdapt(), ADAPTER, make_model()),
            (build_method(dict(type='cotta', bn_batch_stats=True)),
             per_sample, classifier)):
        method.configure(model, adapter)
        for copy_ in (method.model, getattr(method, 'teacher', None)):
            if copy_ is not None:
                assert copy_.body[1].running_mean is None
                assert copy_.body[1].running_var is None
    assert configured(TENT(), make_model()).model.body[1].running_mean \
        is not None


def test_stage_restart_optimizer():
    """``stage_restart=('optimizer', )``: a fresh optimizer's state (no
    moments, step 0) when the stage changes, as CoTTA's ACDC code builds
    its Adam per stage; Adam's is zeroed in place (the same updates,
    tests/core/methods/test_method_state.py)."""
    x = images()
    for fresh in (False, True):
        method = configured(TENT(stage_restart=('optimizer', ) * fresh),
                            make_model())
        first = method.optimizer
        for stage in (0, 0):
            method.start_stage(stage)
            adapt(method, x)
        assert method.optimizer is first and first.state
        method.start_stage(1)
        assert method.optimizer is first
        values = [v for s in first.state.values() for v in s.values()]
        assert values and all(torch.is_tensor(v) for v in values)
        assert all(not v.any() for v in values) == fresh
        assert [p for g in method.optimizer.param_groups
                for p in g['params']] == [p for _, p in method.params]


def test_anchor_signs_are_logged_when_stag_is_configured(monkeypatch):
    """The count of classes with ``s_k > 0`` and the range of ``s_k``, with
    ``s_k`` computed independently: ``dH_k / dZ_kk`` by autograd."""
    model = make_model()
    with torch.no_grad():
        model.classifier.bias.copy_(torch.tensor([3., -2., 0., 1., -1.]))
    weight = model.classifier.weight.detach().flatten(1).double()
    bias = model.classifier.bias.detach().double()
    sens = []
    for k in range(5):
        z = (weight[k] @ weight.T + bias).requires_grad_(True)
        p = z.softmax(0)
        (grad, ) = torch.autograd.grad(-(p * p.log()).sum(), z)
        sens.append(float(grad[k]))
    positive = sum(v > 0 for v in sens)
    assert 0 < positive < 5  # both signs occur for this classifier
    from mmseg_stag.core import stag_loss
    assert stag_loss.log_anchor_signs(model.classifier) == (
        positive, pytest.approx(min(sens)), pytest.approx(max(sens)))
    logged = []
    monkeypatch.setattr(stag_loss, 'print_log',
                        lambda msg, **kwargs: logged.append(msg))
    configured(TENT(stag=dict(beta0=1.0, gamma=1.0)), model)
    assert len(logged) == 1
    assert f'STAG anchors: {positive} of 5 classes have s_k > 0' in logged[0]
    configured(TENT(), model)  # STAG off: nothing to say
    assert len(logged) == 1


def test_bn_adapt_uses_batch_statistics_without_updates():
    model = make_model()
    before = copy.deepcopy(model.state_dict())
    method = configured(BNAdapt(), model)
    assert not method.has_loss and method.params == []
    x = images(n=3)
    reference = make_model()
    reference.body[1].train()
    reference.body[1].momentum = 0.0
    with torch.no_grad():
        expected = reference(x)
    out, _ = adapt(method, x)
    torch.testing.assert_close(out, expected)
    for name, p in model.named_parameters():
        assert torch.equal(p, before[name])


def test_bn_adapt_stag_updates_affine_params_by_stag_alone():
    x = images()
    lr, beta0 = 0.05, 3.0
    delta, model = sgd_update(
        lambda: BNAdapt(stag=dict(beta0=beta0, gamma=5.0),
                        optimizer=dict(type='SGD', lr=lr)), x)
    assert set(delta) == {'body.1.weight', 'body.1.bias', 'body.4.weight',
                          'body.4.bias'}
    fresh = make_model()
    configured(BNAdapt(), fresh)  # batch statistics
    params = dict(select_parameters(fresh))
    for p in params.values():
        p.requires_grad_(True)
    feats, logits = features_and_logits(fresh, x)
    l_stag = stag.stag_loss(feats, logits, fresh.classifier.weight,
                            fresh.classifier.bias)
    grads = torch.autograd.grad(l_stag, list(params.values()))
    for (name, _), grad in zip(params.items(), grads):
        torch.testing.assert_close(delta[name], -lr * beta0 * grad,
                                   rtol=1e-4, atol=1e-7)
    # only norm affine params are trainable; the classifier stays frozen
    assert not model.classifier.weight.requires_grad


def test_adapted_classifier_recomputes_anchors_every_step():
    model = make_model()
    method = configured(
        TENT(stag=dict(beta0=1.0, gamma=10.0),
             trainable=dict(kind='all'), optimizer=dict(type='SGD', lr=0.1)),
        model)
    x = images()
    for _ in range(3):
        adapt(method, x)
    assert method.stag_loss.anchor_computations == 3
    frozen = make_model()
    method = configured(TENT(stag=dict(beta0=1.0, gamma=10.0)), frozen)
    for _ in range(3):
        adapt(method, x)
    assert method.stag_loss.anchor_computations == 1


def test_same_seed_same_updates():
    x = images()
    a, _ = sgd_update(lambda: TENT(stag=dict(beta0=5.0, gamma=3.0)), x)
    b, _ = sgd_update(lambda: TENT(stag=dict(beta0=5.0, gamma=3.0)), x)
    for name in a:
        assert torch.equal(a[name], b[name])


def test_bad_configs_raise():
    with pytest.raises(ValueError, match='beta0'):
        TENT(stag=dict(gamma=1.0))
    with pytest.raises(ValueError, match='norm_types'):
        configured(TENT(trainable=dict(norm_types=('XX', ))), make_model())
    with pytest.raises(ValueError, match='no parameter matches'):
        configured(TENT(trainable=dict(name_regex='nothing')), make_model())
    with pytest.raises(RuntimeError, match='configure'):
        TENT().adapt(Batch(None))
    per_token = TaskAdapter(HeadProbe('classifier'))
    per_token.probe.prediction_kind = 'per_token'  # the probe refuses it
    with pytest.raises(ValueError, match='prediction_kind must be one of'):
        TENT().configure(make_model(), per_token)


def test_tent_takes_few_options():
    """TENT's options, every level a config reaches (its and the base's
    arguments, the ``stag`` and ``trainable`` dicts; the optimizer's are
    torch's): at most 22 (issue 59), none for speed only. A new option
    fails here: add it to the list on purpose."""
    import inspect

    from mmseg_stag.core import STAGLoss
    from mmseg_stag.core.methods.base import BaseMethod

    def arguments(fn, skip=()):
        return {name for name, p in inspect.signature(fn).parameters.items()
                if p.kind is p.POSITIONAL_OR_KEYWORD and name not in skip}

    own = arguments(TENT.__init__, {'self'}) | arguments(
        BaseMethod.__init__, {'self'})
    stag = arguments(STAGLoss.__init__, {'self'}) | {
        'beta0', 'gamma'}
    trainable = arguments(select_parameters, {'model'})
    assert own == {'loss', 'align_corners', 'stag', 'optimizer', 'trainable',
                   'stage_restart', 'bn_batch_stats'}
    assert stag == {'eps', 'anchor', 'label', 'check_finite', 'beta0',
                    'gamma'}
    assert trainable == {'kind', 'norm_types', 'name_regex'}
    assert len(own | stag | trainable) <= 22
