"""Segmentation variants of the core methods and the segmentation-only
methods (Hybrid-TTA), in ``SEGMENTATION_METHODS``."""
from .cotta import SegmentationCoTTA, teacher_labels
from .full_resolution import full_resolution_cross_entropy
from .hybrid_tta import HybridTTA, TuningSwitch
from .registry import SEGMENTATION_METHODS
from .tent import SegmentationTENT

__all__ = [
    'SEGMENTATION_METHODS', 'SegmentationTENT', 'SegmentationCoTTA',
    'teacher_labels', 'full_resolution_cross_entropy', 'HybridTTA',
    'TuningSwitch'
]
