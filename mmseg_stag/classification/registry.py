"""Registries of the classification models, datasets and scenarios."""
from mmengine.registry import Registry

CLS_MODELS = Registry('classification model', scope='mmseg_stag',
                      locations=['mmseg_stag.classification'])
CLS_DATASETS = Registry('corruption dataset', scope='mmseg_stag',
                        locations=['mmseg_stag.classification'])
CLS_SCENARIOS = Registry('test stream scenario', scope='mmseg_stag',
                         locations=['mmseg_stag.classification'])
