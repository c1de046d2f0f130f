"""The numbers of the paper's analysis figures."""
from .anchors import anchor_validation, assignment_matrix, heatmap_classes
from .running import read_per_image, running_accuracy

__all__ = ['assignment_matrix', 'anchor_validation', 'heatmap_classes',
           'read_per_image', 'running_accuracy']
