"""Task-agnostic MMEngine parts: online loop, log processor, task, metric."""
from .log_processor import OnlineAdaptationLogProcessor
from .online_loop import (DISTRIBUTED_ERROR, STATE_FILE, OnlineAdaptationLoop,
                          batch_stage)
from .online_task import ONLINE_TASKS, OnlineBatch, OnlineTask
from .stream_metric import STREAM_TAGS, StreamMetric

__all__ = ['OnlineAdaptationLoop', 'OnlineAdaptationLogProcessor',
           'DISTRIBUTED_ERROR', 'STATE_FILE', 'batch_stage', 'ONLINE_TASKS',
           'OnlineTask', 'OnlineBatch', 'StreamMetric', 'STREAM_TAGS']
