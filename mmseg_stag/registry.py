"""Registries of mmseg_stag's own component kinds.

MMSeg's registries (``MODELS``, ``HOOKS``, ``DATASETS``, ``METRICS``) hold the
MMSeg-facing components; TTA methods are not an MMSeg concept, so they get a
registry of their own.
"""
from mmengine.registry import Registry

TTA_METHODS = Registry('tta method', scope='mmseg_stag',
                       locations=['mmseg_stag.methods'])
