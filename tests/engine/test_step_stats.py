"""The step statistics: typed per pass
(``mmseg_stag.core.task_adapter``), read by the loop in one transfer,
logged in batch order, and every value checked when it is read (SAR logs
one per pass, ``loss_stag1`` and ``loss_stag2``)."""
import math

import pytest
import torch
from mmengine.logging import MessageHub

from mmseg_stag.core import PassStats, StepStats
from mmseg_stag.engine.step_stats import PendingStep, log_step_stats


def test_logged_names_numbered_by_pass():
    one = StepStats([PassStats(loss_base=1.0, loss=2.0,
                               extra=dict(num_kept=3.0))],
                    extra=dict(updated=1.0))
    assert dict(one) == dict(num_kept=3.0, loss_base=1.0, loss=2.0,
                             updated=1.0)
    two = StepStats([PassStats(loss_stag=0.5, beta=2.0),
                     PassStats(loss_stag=0.25)])
    assert dict(two) == dict(loss_stag1=0.5, beta1=2.0, loss_stag2=0.25)
    # SAR numbers its passes even when its second pass did not run
    assert list(StepStats([PassStats(loss=1.0)], numbered=True)) == ['loss1']
    doubled = two.map(lambda v: 2 * v)
    assert doubled['loss_stag2'] == 0.5 and two['loss_stag2'] == 0.25


@pytest.mark.parametrize('passes', [1, 2])
def test_a_non_finite_stag_value_stops_naming_the_batch(passes):
    pending = [PendingStep(3, StepStats([PassStats(
        loss=torch.tensor(1.0), loss_stag=torch.tensor(-0.5),
        beta=2.0)] * passes))]
    bad = [PassStats(loss_stag=torch.tensor(-0.5))] * (passes - 1) + [
        PassStats(loss=torch.tensor(1.0), loss_stag=torch.tensor(math.nan))]
    pending.append(PendingStep(4, StepStats(bad), ['a.png']))
    name = 'loss_stag' if passes == 1 else 'loss_stag2'
    with pytest.raises(ValueError, match=f'^TENT: {name} is nan at batch 4 '
                       r'\(image a.png\): the STAG loss is not finite'):
        log_step_stats(pending, MessageHub.get_instance('test_step_stats_bad'),
                       'TENT')


@pytest.mark.parametrize('name', ['loss', 'loss_base', 'num_kept', 'beta'])
def test_every_logged_value_is_checked(name):
    """Not only the STAG term: the total loss, the base loss, a method's
    own number; the first non-finite value in batch order is named, and
    nothing of the read is logged."""
    hub = MessageHub.get_instance(f'test_step_stats_{name}')
    values = dict(loss=torch.tensor(1.0), loss_base=torch.tensor(0.5),
                  beta=2.0)
    good = PassStats(**values, extra=dict(num_kept=torch.tensor(3.0)))
    bad_values = dict(values, extra=dict(num_kept=torch.tensor(3.0)))
    if name == 'num_kept':
        bad_values['extra'] = dict(num_kept=torch.tensor(math.inf))
    else:
        bad_values[name] = torch.tensor(-math.inf)
    pending = [PendingStep(i, StepStats([good])) for i in range(2)] + [
        PendingStep(2, StepStats([PassStats(**bad_values)]),
                    [f'img{j}.png' for j in range(6)]),
        PendingStep(3, StepStats([PassStats(**bad_values)]))]
    with pytest.raises(ValueError) as err:
        log_step_stats(pending, hub, 'EATA')
    assert str(err.value).startswith(
        f'EATA: {name} is {float(err.value.value)} at batch 2 (image '
        'img0.png, img1.png, img2.png, img3.png and 2 more): the step is '
        'not finite')
    assert f'test/{name}' not in hub.log_scalars


def test_values_are_logged_in_batch_order():
    hub = MessageHub.get_instance('test_step_stats_ok')
    pending = [PendingStep(idx, StepStats(
        [PassStats(loss_stag=torch.tensor(float(idx)))], numbered=True,
        extra=dict(loss_reg=float(idx) + 0.5))) for idx in range(3)]
    log_step_stats(pending, hub)
    assert list(hub.log_scalars['test/loss_stag1'].data[0]) == [0, 1, 2]
    assert list(hub.log_scalars['test/loss_reg'].data[0]) == [0.5, 1.5, 2.5]


def test_a_read_not_arrived_is_logged_later_in_batch_order(
        tiny_acdc, tiny_checkpoint, tmp_path, monkeypatch):
    """At the logger's interval the loop starts a read and logs only the
    reads that have arrived (on a GPU a copy to pinned memory; asked, never
    waited for); a stage's end waits for every read: with reads that never
    arrive early, nothing is logged inside a stage and everything, in
    batch order, at its end."""
    from seg_helpers import make_runner

    from mmseg_stag.engine import step_stats
    monkeypatch.setattr(step_stats.StatsRead, 'ready', lambda self: False)
    runner = make_runner('tent-stag', tiny_acdc, tiny_checkpoint, tmp_path,
                         extra={'default_hooks.logger.interval': 1})
    loop, logged = runner.test_loop, []
    log_stats = loop.log_stats

    def recorded(wait=True):
        values = log_stats(wait)
        logged.append((wait, len(values), len(loop.reads)))
        return values

    monkeypatch.setattr(loop, 'log_stats', recorded)
    runner.test()
    # 4 stages of 2 images: per stage a started read, then the end's wait
    assert logged == [(False, 0, 1), (False, 0, 2), (True, 2, 0)] * 4
    history = runner.message_hub.log_scalars['test/loss'].data[0]
    assert len(history) == 8


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason='no CUDA device')
def test_a_read_on_cuda_waits_for_nothing_until_its_values():
    """On a GPU: starting a read and asking whether it arrived make no
    synchronising call (CUDA's sync debug mode raises on one); the values
    are those of the tensors."""
    pending = [PendingStep(i, StepStats([PassStats(
        loss=torch.tensor(float(i), device='cuda') * 2,
        loss_stag=torch.tensor(0.5, device='cuda'))])) for i in range(3)]
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode('error')
    try:
        read = step_stats_read(pending)
        read.ready()
    finally:
        torch.cuda.set_sync_debug_mode('default')
    assert read.values() == [dict(loss_stag=0.5, loss=2.0 * i)
                             for i in range(3)]


def step_stats_read(pending):
    from mmseg_stag.engine.step_stats import StatsRead
    return StatsRead(pending)
