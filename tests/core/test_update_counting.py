"""One definition of a counted update (``BaseMethod.adapt``): a step
counts, once, exactly when at least one optimizer step was applied to the
adapted parameters; ``t`` of ``beta_t`` and ``num_updates`` both count
those steps (docs/methods.md, "Counted updates"). A step the
``GradScaler`` skips (fp16, non-finite gradients) is not counted, and the
count is kept on the device so that the step reads nothing back; SAR's
momentum-only step with no reliable sample is counted; EcoTTA's two
optimizer steps of a batch count once."""
import math

import pytest
import torch
from host_syncs import HostSyncCounter
from reference.adaptation_testbed import make_cnn, unit_images

from mmseg_stag.classification import WideResNet
from mmseg_stag.classification.ecotta_network import attach_meta_networks
from mmseg_stag.core import Batch, HeadProbe, TaskAdapter, build_method

STAG = dict(beta0=2.0, gamma=3.0)
OVERFLOW = float('inf')  # a loss scale that overflows every gradient


def weights(model):
    return {k: v.detach().clone() for k, v in model.named_parameters()}


def moved(model, before):
    return any(not torch.equal(v, before[k])
               for k, v in model.named_parameters())


def adapt(method, seed):
    with torch.enable_grad():
        return method.adapt(Batch(unit_images(seed).float()))


def fp16_tent(init_scale, **optimizer):
    model = make_cnn().float()
    method = build_method(dict(
        type='tent', stag=STAG, trainable=dict(kind='all'),
        stage_restart=('beta_t', ),
        optimizer=dict(type='Adam', lr=1e-2, **optimizer)))
    method.configure(model, TaskAdapter(HeadProbe('5')))
    method.use_grad_scaler('cpu')
    method.grad_scaler = torch.amp.GradScaler('cpu', init_scale=init_scale)
    return model, method


def test_a_step_the_grad_scaler_skips_is_not_counted():
    """Every gradient overflows: the scaler skips the optimizer step, so
    the weights, ``t``, ``num_updates`` and ``beta_t`` stay as they
    were."""
    model, method = fp16_tent(OVERFLOW)
    before = weights(model)
    for seed in range(3):
        _, stats = adapt(method, seed)
        assert float(stats.updated) == 0.0
    assert not moved(model, before)
    assert method.t == 0 and method.num_updates == 0
    assert method.beta == STAG['beta0']
    # and the logged beta_t is that of t = 0 at every step
    assert float(stats['beta']) == STAG['beta0']


def test_an_applied_fp16_step_is_counted_on_the_device():
    """A finite scale: each step is applied and counted, the count read
    only when asked for; ``beta_t`` follows it; a stage restart of
    ``beta_t`` sets ``t`` back to 0 and keeps ``num_updates``."""
    model, method = fp16_tent(2.0 ** 8)
    before = weights(model)
    betas = [float(adapt(method, seed)[1]['beta']) for seed in range(3)]
    assert moved(model, before)
    assert method.t == method.num_updates == 3
    for t, beta in enumerate(betas):
        assert beta == pytest.approx(STAG['beta0'] * math.exp(
            -t / STAG['gamma']), rel=1e-6)
    state = method.state_dict()
    assert (state['t'], state['num_updates']) == (3, 3)
    method.start_stage(0)
    method.start_stage(1)
    assert method.t == 0 and method.num_updates == 3
    adapt(method, 5)
    assert method.t == 1 and method.num_updates == 4
    method.load_state_dict(state)
    assert method.t == method.num_updates == 3


def test_the_fp16_count_reads_nothing_on_the_host():
    """With a fused Adam the scaler skips on the device; counting the
    step (skipped or applied) adds no read of the device to it."""
    for scale in (OVERFLOW, 2.0 ** 8):
        model, method = fp16_tent(scale, fused=True)
        counter = HostSyncCounter()
        with counter:
            for seed in range(2):
                adapt(method, seed)
        assert counter.calls == [], (scale, counter.calls)
        assert method.num_updates == (0 if scale == OVERFLOW else 2)


def sar(model, **kwargs):
    method = build_method(dict(
        type='sar', trainable=dict(kind='all'), exclude_regex=None,
        recovery_threshold=0.0, entropy_margin=1.0,
        optimizer=dict(type='SGD', lr=0.05, momentum=0.9), **kwargs))
    method.configure(model, TaskAdapter(HeadProbe('5')))
    return method


def test_sar_momentum_step_with_no_reliable_sample_is_counted():
    """No reliable sample: the authors' NaN loss still steps SGD's
    momentum, which moves the weights; that step is counted. Without
    ``momentum_step_on_empty`` nothing moves and nothing is counted."""
    model = make_cnn().float()
    method = sar(model)
    adapt(method, 0)  # a SAM update: the momentum buffers exist
    assert method.t == method.num_updates == 1
    method.e_margin = 1e-9  # nothing is reliable
    before = weights(model)
    _, stats = adapt(method, 1)
    assert stats['momentum_only_step'] == 1.0
    assert moved(model, before)
    assert method.t == method.num_updates == 2

    model = make_cnn().float()
    method = sar(model, momentum_step_on_empty=False)
    adapt(method, 0)
    method.e_margin = 1e-9
    before = weights(model)
    adapt(method, 1)
    assert not moved(model, before)
    assert method.t == method.num_updates == 1


PARTS, SIZE, BLOCKS = [1, 1, 2, 2], (3, 16, 16), r'block\d\.layer\.\d+'


def ecotta(**kwargs):
    torch.manual_seed(0)
    model = WideResNet(depth=16, widen_factor=1, num_classes=10)
    attach_meta_networks(model, BLOCKS, PARTS, SIZE)
    method = build_method(dict(
        type='ecotta', optimizer=dict(type='SGD', lr=0.05, momentum=0.9),
        **kwargs))
    method.configure(model.train(), TaskAdapter(HeadProbe('fc')))
    return model, method


def ecotta_adapt(method, seed):
    x = torch.rand(4, *SIZE, generator=torch.Generator().manual_seed(seed))
    with torch.enable_grad():
        return method.adapt(Batch(x))


def test_ecotta_counts_its_two_optimizer_steps_once_per_batch():
    model, method = ecotta(stag=STAG)
    steps = []
    method.optimizer.step = counting(method.optimizer.step, steps)
    for seed in range(3):
        _, stats = ecotta_adapt(method, seed)
        assert stats['beta'] == STAG['beta0'] * math.exp(
            -seed / STAG['gamma'])
    assert len(steps) == 6  # the regularisation step, the entropy step
    assert method.t == method.num_updates == 3


def counting(step, calls):
    def run(*args, **kwargs):
        calls.append(1)
        return step(*args, **kwargs)
    return run


def test_ecotta_fp16_overflow_counts_nothing():
    """Both of EcoTTA's steps skipped by the scaler: no update counted,
    the meta networks unchanged."""
    model, method = ecotta()
    method.use_grad_scaler('cpu')
    method.grad_scaler = torch.amp.GradScaler('cpu', init_scale=OVERFLOW)
    before = weights(model)
    for seed in range(2):
        ecotta_adapt(method, seed)
    assert not moved(model, before)
    assert method.t == method.num_updates == 0
