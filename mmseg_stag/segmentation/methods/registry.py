"""The segmentation variants of the core methods: a child of
:data:`mmseg_stag.core.METHODS`, so a segmentation config's ``type='tent'``
finds the per-pixel TENT here and ``type='eata'`` the core's EATA."""
from mmengine.registry import Registry

from mmseg_stag.core import METHODS

SEGMENTATION_METHODS = Registry(
    'segmentation online adaptation method', parent=METHODS,
    scope='mmseg_stag_segmentation',
    locations=['mmseg_stag.segmentation.methods'])
