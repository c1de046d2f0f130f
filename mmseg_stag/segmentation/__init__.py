"""The MMSeg side: registers the segmentation task of the online loop, the
NVlabs SegFormer backbone and head, the ACDC stream and its views, the
per-stage metric, the per-pixel method variants and ``STAGLoss`` in MMSeg's registries (imported by ``import
mmseg_stag`` when MMSeg is there)."""
from mmseg.registry import MODELS

from mmseg_stag.core import STAGLoss
from .datasets import (CONTINUAL_META_KEYS, STREAM_TAGS, ACDCContinualDataset,
                       ScaleFlipViews)
from .evaluation import ContinualIoUMetric
from .methods import (SEGMENTATION_METHODS, SegmentationBatchContext,
                      SegmentationCoTTA, SegmentationTENT, View)
from .online_task import SegmentationTask
from .models import (NVMixVisionTransformer, NVSegformerHead,
                     convert_nvlabs_checkpoint, convert_nvlabs_mit,
                     convert_nvlabs_segformer)

# the core's loss, buildable from MMSeg configs: dict(type='STAGLoss')
MODELS.register_module(module=STAGLoss)

__all__ = [
    'SegmentationTask', 'SEGMENTATION_METHODS', 'SegmentationBatchContext',
    'SegmentationTENT', 'SegmentationCoTTA', 'View',
    'ACDCContinualDataset', 'CONTINUAL_META_KEYS', 'STREAM_TAGS',
    'ScaleFlipViews', 'ContinualIoUMetric', 'NVMixVisionTransformer',
    'NVSegformerHead', 'convert_nvlabs_segformer', 'convert_nvlabs_mit',
    'convert_nvlabs_checkpoint'
]
