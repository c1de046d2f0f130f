"""The loop's step statistics: read in one transfer, logged in batch
order, and every STAG value checked when it is read (SAR logs one per
pass, ``loss_stag1`` and ``loss_stag2``)."""
import math

import pytest
import torch
from mmengine.logging import MessageHub

from mmseg_stag.engine.step_stats import StepStats


@pytest.mark.parametrize('key', ['loss_stag', 'loss_stag1', 'loss_stag2'])
def test_a_non_finite_stag_value_stops_naming_the_batch(key):
    stats = StepStats()
    stats.append(3, dict(loss=torch.tensor(1.0), loss_stag=torch.tensor(
        -0.5), beta=2.0))
    stats.append(4, {'loss': torch.tensor(1.0), key: torch.tensor(
        math.nan)})
    with pytest.raises(ValueError, match=f'{key} is nan at batch 4'):
        stats.flush(MessageHub.get_instance('test_step_stats_bad'))


def test_values_are_logged_in_batch_order():
    hub = MessageHub.get_instance('test_step_stats_ok')
    stats = StepStats()
    for idx in range(3):
        stats.append(idx, dict(loss_stag1=torch.tensor(float(idx)),
                               loss=float(idx) + 0.5))
    stats.flush(hub)
    assert list(hub.log_scalars['test/loss_stag1'].data[0]) == [0, 1, 2]
    assert list(hub.log_scalars['test/loss'].data[0]) == [0.5, 1.5, 2.5]
    assert stats.pending == []
