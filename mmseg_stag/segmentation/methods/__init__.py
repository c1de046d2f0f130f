"""Segmentation's own methods: CoTTA per pixel (the task builds it for
``type='cotta'``: ``online_task.OWN_METHODS``) and Hybrid-TTA (``METHODS``'
``hybrid_tta``)."""
from .cotta import SegmentationCoTTA, teacher_labels
from .hybrid_tta import HybridTTA, TuningSwitch

__all__ = ['SegmentationCoTTA', 'teacher_labels', 'HybridTTA', 'TuningSwitch']
