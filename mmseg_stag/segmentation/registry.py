"""The segmentation task's methods where they differ from ``METHODS``' of
the same name: a child registry, which finds every other name in its
parent (MMEngine's registry hierarchy, as MMSeg's ``MODELS`` finds
MMEngine's)."""
from mmengine.registry import Registry

from mmseg_stag.core import METHODS

#: ``cotta``: CoTTA per pixel (``SegmentationCoTTA``); the rest: ``METHODS``
SEG_METHODS = Registry('segmentation online adaptation method',
                       parent=METHODS, scope='mmseg_stag_seg',
                       locations=['mmseg_stag.segmentation.methods'])
