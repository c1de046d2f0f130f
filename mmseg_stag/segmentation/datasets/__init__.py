from .acdc import CONTINUAL_META_KEYS, STREAM_TAGS, ACDCContinualDataset
from .compact_labels import LabelsAsUint8
from .scale_flip_views import ScaleFlipViews

__all__ = [
    'ACDCContinualDataset', 'CONTINUAL_META_KEYS', 'STREAM_TAGS',
    'LabelsAsUint8', 'ScaleFlipViews'
]
