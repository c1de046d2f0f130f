from .base import (NORM_LAYER_TYPES, TTAMethod, norm_layers,
                   per_sample_logits, select_parameters, softmax_entropy,
                   use_batch_statistics)
from .bn_adapt import BNAdapt
from .cotta import CoTTA
from .deyo import DeYO
from .eata import EATA
from .sar import SAR
from .source import Source
from .tent import TENT

__all__ = [
    'TTAMethod', 'Source', 'BNAdapt', 'TENT', 'EATA', 'SAR', 'DeYO', 'CoTTA',
    'NORM_LAYER_TYPES', 'norm_layers', 'per_sample_logits',
    'select_parameters', 'softmax_entropy',
    'use_batch_statistics'
]
