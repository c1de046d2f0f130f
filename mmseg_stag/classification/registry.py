"""Registries of the classification components (models, data, scenarios).

They live here rather than in MMSeg's registries: none of them is an MMSeg
concept. Methods come from :data:`mmseg_stag.core.METHODS`.
"""
from mmengine.registry import Registry

CLS_MODELS = Registry('classification model', scope='mmseg_stag',
                      locations=['mmseg_stag.classification'])
CLS_DATASETS = Registry('corruption dataset', scope='mmseg_stag',
                        locations=['mmseg_stag.classification'])
CLS_SCENARIOS = Registry('test stream scenario', scope='mmseg_stag',
                         locations=['mmseg_stag.classification'])
