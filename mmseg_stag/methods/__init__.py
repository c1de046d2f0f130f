from .base import (NORM_LAYER_TYPES, TTAMethod, norm_layers,
                   select_parameters, softmax_entropy, use_batch_statistics)
from .bn_adapt import BNAdapt
from .source import Source
from .tent import TENT

__all__ = [
    'TTAMethod', 'Source', 'BNAdapt', 'TENT', 'NORM_LAYER_TYPES',
    'norm_layers', 'select_parameters', 'softmax_entropy',
    'use_batch_statistics'
]
