from .continual_metric import ContinualIoUMetric, stage_miou

__all__ = ['ContinualIoUMetric', 'stage_miou']
