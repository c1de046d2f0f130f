from .log_processor import OnlineAdaptationLogProcessor
from .online_loop import OnlineAdaptationLoop, batch_stage

__all__ = ['OnlineAdaptationLoop', 'OnlineAdaptationLogProcessor',
           'batch_stage']
