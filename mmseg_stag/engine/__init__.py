"""Task-agnostic MMEngine parts: online loop, log processor, task, metric."""
from .launch_guard import DISTRIBUTED_ERROR
from .log_processor import OnlineAdaptationLogProcessor
from .online_loop import OnlineAdaptationLoop
from .online_task import ONLINE_TASKS, OnlineTask
from .run_state import STATE_FILE
from .stream import StreamSchedule, StreamStage
from .stream_metric import StreamMetric

__all__ = ['OnlineAdaptationLoop', 'OnlineAdaptationLogProcessor',
           'DISTRIBUTED_ERROR', 'STATE_FILE', 'ONLINE_TASKS', 'OnlineTask',
           'StreamMetric', 'StreamStage', 'StreamSchedule']
