"""The task-agnostic core in plain PyTorch and MMEngine: no MMSeg, no MMCV."""
from . import stag
from .losses import (cross_entropy_to_teacher, flatten_outputs,
                     mean_over_outputs, pseudo_label_cross_entropy,
                     softmax_entropy, symmetric_cross_entropy)
from .methods import (EATA, SAR, TENT, BaseMethod, BNAdapt, CoTTA, DeYO,
                      EcoTTA, Source)
from .params import (NORM_LAYER_TYPES, norm_layers, select_parameters,
                     use_batch_statistics)
from .probe import PREDICTION_KINDS, HeadProbe
from .registry import METHODS, build_method
from .sam import SAM
from .stag_loss import STAGLoss
from .task_adapter import (Batch, ForwardPass, Labels, Logits,
                           NonFiniteStatistic, PassStats, Prediction,
                           StepStats, TaskAdapter)

__all__ = [
    'stag', 'STAGLoss', 'HeadProbe', 'PREDICTION_KINDS', 'METHODS',
    'build_method', 'BaseMethod', 'Batch', 'ForwardPass', 'Logits', 'Labels',
    'Prediction', 'TaskAdapter', 'PassStats', 'StepStats',
    'NonFiniteStatistic', 'Source',
    'BNAdapt', 'TENT', 'EATA', 'SAR', 'DeYO', 'CoTTA', 'EcoTTA', 'SAM',
    'NORM_LAYER_TYPES', 'norm_layers', 'select_parameters',
    'use_batch_statistics', 'softmax_entropy', 'pseudo_label_cross_entropy',
    'cross_entropy_to_teacher', 'symmetric_cross_entropy',
    'mean_over_outputs', 'flatten_outputs'
]
