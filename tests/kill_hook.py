"""Test-only MMEngine hook: SIGKILL its own process mid-stream, as a crash
would, when ``KILL_AT_STAGE='<stage>,<batch>'`` is set (inert otherwise, so
the killed and the resumed run share one config)."""
import os
import signal

from mmengine.hooks import Hook
from mmengine.registry import HOOKS


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
        # the loop's schedule says where the batch is in the stream
        current = runner.test_loop.schedule[batch_idx].stage.index
        self.seen[current] = self.seen.get(current, 0) + 1
        if current == stage and self.seen[current] == nth:
            os.kill(os.getpid(), signal.SIGKILL)
