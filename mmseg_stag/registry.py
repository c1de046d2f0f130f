"""Registries of mmseg_stag's own component kinds.

MMSeg's registries (``MODELS``, ``HOOKS``, ``DATASETS``, ``METRICS``) hold the
MMSeg-facing components; TTA methods are not an MMSeg concept, so they get a
registry of their own.
"""
from mmengine.registry import Registry

TTA_METHODS = Registry('tta method', scope='mmseg_stag',
                       locations=['mmseg_stag.methods'])


def build_tta_method(cfg: dict):
    """Build a TTA method from ``TTA_METHODS`` (in its own scope, whatever
    the caller's default scope is, e.g. ``mmseg`` inside a Runner)."""
    return TTA_METHODS.build(dict(cfg, _scope_='mmseg_stag'))
