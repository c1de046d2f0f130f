from .acdc import ACDCContinualDataset
from .compact_labels import LabelsAsUint8
from .scale_flip_views import ScaleFlipViews

__all__ = ['ACDCContinualDataset', 'LabelsAsUint8', 'ScaleFlipViews']
