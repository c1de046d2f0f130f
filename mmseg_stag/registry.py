"""The registries of the ``mmseg_stag`` scope (MMEngine looks for
``<scope>.registry``): the online-adaptation methods and the classification
harness's models, datasets and scenarios. MMSeg-facing parts live in MMSeg's
own registries (``mmseg_stag.segmentation``)."""
from .classification.registry import CLS_DATASETS, CLS_MODELS, CLS_SCENARIOS
from .core.registry import METHODS

__all__ = ['METHODS', 'CLS_MODELS', 'CLS_DATASETS', 'CLS_SCENARIOS']
