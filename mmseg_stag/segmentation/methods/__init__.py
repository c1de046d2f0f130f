"""Segmentation variants of the core methods, in ``SEGMENTATION_METHODS``."""
from .cotta import SegmentationCoTTA, teacher_labels
from .full_resolution import full_resolution_cross_entropy
from .registry import SEGMENTATION_METHODS
from .tent import SegmentationTENT

__all__ = [
    'SEGMENTATION_METHODS', 'SegmentationTENT', 'SegmentationCoTTA',
    'teacher_labels', 'full_resolution_cross_entropy'
]
