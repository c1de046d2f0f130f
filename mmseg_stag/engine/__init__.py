"""The MMEngine side, task-agnostic (no MMSeg import): the online loop and
its log processor (registered in MMEngine's root registries, so any scope
finds them), the tasks' interface, the per-stage metric base and the one
report writer."""
from .log_processor import OnlineAdaptationLogProcessor
from .online_loop import (DISTRIBUTED_ERROR, STATE_FILE, OnlineAdaptationLoop,
                          batch_stage)
from .online_task import ONLINE_TASKS, OnlineBatch, OnlineTask
from .stream_metric import STREAM_TAGS, StreamMetric

__all__ = ['OnlineAdaptationLoop', 'OnlineAdaptationLogProcessor',
           'DISTRIBUTED_ERROR', 'STATE_FILE', 'batch_stage', 'ONLINE_TASKS',
           'OnlineTask', 'OnlineBatch', 'StreamMetric', 'STREAM_TAGS']
