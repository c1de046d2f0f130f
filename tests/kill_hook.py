"""Test-only MMEngine hook: SIGKILL its own process mid-stream, as a crash
would, when ``KILL_AT_STAGE='<stage>,<batch>'`` is set (inert otherwise, so
the killed and the resumed run share one config)."""
import os
import signal

from mmengine.hooks import Hook
from mmengine.registry import HOOKS

from mmseg_stag.engine import batch_stage


def batch_metas(data_batch: dict) -> list:
    """The metainfo of a batch's samples (first view of a multi-view
    segmentation batch)."""
    samples = data_batch['data_samples']
    if samples and isinstance(samples[0], (list, tuple)):
        samples = samples[0]
    return [s.metainfo for s in samples]


@HOOKS.register_module()
class KillAtStage(Hook):
    """Kill before the ``<batch>``-th batch (1-based) of stage ``<stage>``."""

    def __init__(self):
        self.seen = {}

    def before_test_iter(self, runner, batch_idx, data_batch=None):
        at = os.environ.get('KILL_AT_STAGE')
        if not at:
            return
        stage, nth = map(int, at.split(','))
        current = batch_stage(batch_metas(data_batch))
        self.seen[current] = self.seen.get(current, 0) + 1
        if current == stage and self.seen[current] == nth:
            os.kill(os.getpid(), signal.SIGKILL)
