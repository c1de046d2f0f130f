"""Classification half of STAG: corrupted test sets, test-stream scenarios,
source models, and the online predict-then-adapt runner.

The TTA methods (and ``STAGLoss``) are the same objects as for
segmentation (:data:`mmseg_stag.registry.TTA_METHODS`); this package only
feeds them ``(features [N, D], logits [N, C])`` from one forward pass.
"""
from .data import (CIFARC, CORRUPTIONS, IMAGENET_MEAN, IMAGENET_STD,
                   ImageFolder, NumpyImages,
                   SHORT_NAMES, CorruptionSet, ImageNetC, StreamData,
                   build_corruption_sets, imagenet_preprocess, to_tensor)
from .experiment import run_experiment
from .forward import find_classifier, make_forward
from .models import build_cls_model, load_weights
from .registry import CLS_DATASETS, CLS_MODELS, CLS_SCENARIOS
from .report import format_table, table_values, write_results
from .runner import (METHOD_NAMES, RowResult, RowSpec, SourceData,
                     rows_from_config,
                     run_key, run_row)
from .scenarios import Stage, build_stream
from .small_models import SmallCNN, SmallViT
from .wide_resnet import WideResNet, wrn28_10_standard, wrn40_2_augmix

__all__ = [
    'CORRUPTIONS', 'SHORT_NAMES', 'IMAGENET_MEAN', 'IMAGENET_STD',
    'CorruptionSet', 'ImageNetC', 'CIFARC', 'ImageFolder', 'NumpyImages',
    'SourceData', 'StreamData',
    'build_corruption_sets', 'imagenet_preprocess', 'to_tensor',
    'Stage', 'build_stream', 'find_classifier', 'make_forward',
    'build_cls_model', 'load_weights', 'WideResNet', 'wrn28_10_standard',
    'wrn40_2_augmix', 'SmallCNN', 'SmallViT', 'RowSpec', 'RowResult',
    'rows_from_config', 'run_row', 'run_key', 'METHOD_NAMES',
    'format_table', 'table_values', 'write_results', 'run_experiment',
    'CLS_MODELS', 'CLS_DATASETS', 'CLS_SCENARIOS'
]
