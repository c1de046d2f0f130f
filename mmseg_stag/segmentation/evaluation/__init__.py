from .continual_metric import ContinualIoUMetric, stage_result

__all__ = ['ContinualIoUMetric', 'stage_result']
