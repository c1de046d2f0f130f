from .acdc import ACDCContinualDataset
from .compact_labels import LabelsAsUint8
from .frame_stream import FrameStream, unlabeled_pipeline
from .scale_flip_views import ScaleFlipViews

__all__ = ['ACDCContinualDataset', 'FrameStream', 'LabelsAsUint8',
           'ScaleFlipViews', 'unlabeled_pipeline']
