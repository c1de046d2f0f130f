"""Registries of the ``mmseg_stag`` scope, children of MMEngine's roots."""
from mmengine import registry as mmengine_registry
from mmengine.registry import DATA_SAMPLERS as MMENGINE_DATA_SAMPLERS
from mmengine.registry import DATASETS as MMENGINE_DATASETS
from mmengine.registry import METRICS as MMENGINE_METRICS
from mmengine.registry import MODELS as MMENGINE_MODELS
from mmengine.registry import Registry

from .core.registry import METHODS

MODELS = Registry('model', parent=MMENGINE_MODELS, scope='mmseg_stag',
                  locations=['mmseg_stag.classification'])
DATASETS = Registry('dataset', parent=MMENGINE_DATASETS, scope='mmseg_stag',
                    locations=['mmseg_stag.classification'])
DATA_SAMPLERS = Registry('data sampler', parent=MMENGINE_DATA_SAMPLERS,
                         scope='mmseg_stag',
                         locations=['mmseg_stag.classification'])
METRICS = Registry('metric', parent=MMENGINE_METRICS, scope='mmseg_stag',
                   locations=['mmseg_stag.classification'])

# empty children of the MMEngine roots that a run of the configs in this
# scope (default_scope='mmseg_stag': the classification ones) builds from:
# hooks, the loop, the log processor, the visualizer's backends, a
# method's optimizer. MMEngine looks for the scope's child in each and
# warns where it finds none; tests/classification/test_registries.py holds
# the list to what a run uses (the segmentation configs run in 'mmseg')
HOOKS, LOOPS, LOG_PROCESSORS, VISBACKENDS, OPTIMIZERS = [
    Registry(name.lower(), parent=getattr(mmengine_registry, name),
             scope='mmseg_stag')
    for name in ('HOOKS', 'LOOPS', 'LOG_PROCESSORS', 'VISBACKENDS',
                 'OPTIMIZERS')]

# the classification registries live in mmseg_stag.classification.registry
__all__ = ['METHODS', 'MODELS', 'DATASETS', 'DATA_SAMPLERS', 'METRICS']
