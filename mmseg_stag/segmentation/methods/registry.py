"""The registry of segmentation methods, a child of the core ``METHODS``."""
from mmengine.registry import Registry

from mmseg_stag.core import METHODS

SEGMENTATION_METHODS = Registry(
    'segmentation online adaptation method', parent=METHODS,
    scope='mmseg_stag_segmentation',
    locations=['mmseg_stag.segmentation.methods'])
