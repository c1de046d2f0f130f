"""Classification half of STAG: corrupted test sets, test-stream scenarios,
source models, and the online predict-then-adapt runner.

The online-adaptation methods, ``STAGLoss`` and the head probe are the same
objects as for segmentation (:mod:`mmseg_stag.core`); this package feeds
them ``(features [N, D], logits [N, C])`` from one forward pass. Neither
MMSeg nor MMCV is needed.
"""
from .data import (CIFARC, CORRUPTIONS, IMAGENET_MEAN, IMAGENET_STD,
                   ImageFolder, NumpyImages,
                   SHORT_NAMES, CorruptionSet, ImageNetC, StreamData,
                   build_corruption_sets, imagenet_preprocess, to_tensor)
from .experiment import run_experiment
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
    'Stage', 'build_stream',
    'build_cls_model', 'load_weights', 'WideResNet', 'wrn28_10_standard',
    'wrn40_2_augmix', 'SmallCNN', 'SmallViT', 'RowSpec', 'RowResult',
    'rows_from_config', 'run_row', 'run_key', 'METHOD_NAMES',
    'format_table', 'table_values', 'write_results', 'run_experiment',
    'CLS_MODELS', 'CLS_DATASETS', 'CLS_SCENARIOS'
]
