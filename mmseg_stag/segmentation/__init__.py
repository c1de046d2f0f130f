"""The MMSeg side: segmentation task, models, ACDC stream, metric, methods."""
from .datasets import ACDCContinualDataset, ScaleFlipViews
from .evaluation import ContinualIoUMetric
from .methods import HybridTTA, SegmentationCoTTA
from .models import NVMixVisionTransformer, NVSegformerHead
from .online_task import SegmentationTask
from .task_adapter import SegmentationAdapter, SegmentationBatch

__all__ = [
    'SegmentationTask', 'SegmentationBatch', 'SegmentationAdapter',
    'SegmentationCoTTA', 'HybridTTA', 'ACDCContinualDataset',
    'ScaleFlipViews', 'ContinualIoUMetric', 'NVMixVisionTransformer',
    'NVSegformerHead'
]
