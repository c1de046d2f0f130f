"""The step statistics: typed per pass (``mmseg_stag.core.stats``), read
by the loop in one transfer, logged in batch order, and every pass's STAG
value checked when it is read (SAR logs one per pass, ``loss_stag1`` and
``loss_stag2``)."""
import math

import pytest
import torch
from mmengine.logging import MessageHub

from mmseg_stag.core import PassStats, StepStats
from mmseg_stag.engine.step_stats import log_step_stats


def test_logged_names_numbered_by_pass():
    one = StepStats([PassStats(loss_base=1.0, loss=2.0,
                               extra=dict(num_kept=3.0))],
                    extra=dict(updated=1.0))
    assert dict(one) == dict(num_kept=3.0, loss_base=1.0, loss=2.0,
                             updated=1.0)
    assert one.stag_values() == []
    two = StepStats([PassStats(loss_stag=0.5, beta=2.0),
                     PassStats(loss_stag=0.25)])
    assert dict(two) == dict(loss_stag1=0.5, beta1=2.0, loss_stag2=0.25)
    assert two.stag_values() == [('loss_stag1', 0.5), ('loss_stag2', 0.25)]
    # SAR numbers its passes even when its second pass did not run
    assert list(StepStats([PassStats(loss=1.0)], numbered=True)) == ['loss1']
    doubled = two.map(lambda v: 2 * v)
    assert doubled['loss_stag2'] == 0.5 and two['loss_stag2'] == 0.25


@pytest.mark.parametrize('passes', [1, 2])
def test_a_non_finite_stag_value_stops_naming_the_batch(passes):
    pending = [(3, StepStats([PassStats(loss=torch.tensor(1.0),
                                        loss_stag=torch.tensor(-0.5),
                                        beta=2.0)] * passes))]
    bad = [PassStats(loss_stag=torch.tensor(-0.5))] * (passes - 1) + [
        PassStats(loss=torch.tensor(1.0), loss_stag=torch.tensor(math.nan))]
    pending.append((4, StepStats(bad)))
    name = 'loss_stag' if passes == 1 else 'loss_stag2'
    with pytest.raises(ValueError, match=f'{name} is nan at batch 4'):
        log_step_stats(pending, MessageHub.get_instance('test_step_stats_bad'))


def test_values_are_logged_in_batch_order():
    hub = MessageHub.get_instance('test_step_stats_ok')
    pending = [(idx, StepStats(
        [PassStats(loss_stag=torch.tensor(float(idx)))], numbered=True,
        extra=dict(loss_reg=float(idx) + 0.5))) for idx in range(3)]
    log_step_stats(pending, hub)
    assert list(hub.log_scalars['test/loss_stag1'].data[0]) == [0, 1, 2]
    assert list(hub.log_scalars['test/loss_reg'].data[0]) == [0.5, 1.5, 2.5]
