"""Classification task of the online loop: streams, models, metric."""
from .classifier import ClassifierPreprocessor, OnlineClassifier
from .data import (CIFARC, CORRUPTIONS, IMAGENET_MEAN, IMAGENET_STD,
                   SHORT_NAMES, CorruptionSet, ImageFolder, ImageNetC,
                   NumpyImages, StreamData, build_corruption_sets,
                   imagenet_preprocess, to_uint8_chw)
from .ecotta_network import ECOTTA_PRESETS, ecotta_network
from .metric import StreamAccuracyMetric
from .models import load_weights
from .online_task import ClassificationTask
from .registry import CLS_DATASETS, CLS_MODELS, CLS_SCENARIOS
from .scenarios import build_stream
from .small_models import SmallCNN, SmallViT
from .stream import (CorruptionStream, SeededShuffleSampler, SourceImages,
                     StageBatchSampler)
from .wide_resnet import WideResNet, wrn28_10_standard, wrn40_2_augmix

#: display names of the registered methods (paper spelling)
METHOD_NAMES = dict(source='Source', bn_adapt='BN Adapt', tent='TENT',
                    eata='EATA', sar='SAR', deyo='DeYO', cotta='CoTTA',
                    ecotta='EcoTTA')

__all__ = [
    'CORRUPTIONS', 'SHORT_NAMES', 'IMAGENET_MEAN', 'IMAGENET_STD',
    'CorruptionSet', 'ImageNetC', 'CIFARC', 'ImageFolder', 'NumpyImages',
    'StreamData', 'build_corruption_sets', 'imagenet_preprocess',
    'to_uint8_chw', 'build_stream', 'CorruptionStream',
    'SourceImages', 'StageBatchSampler', 'SeededShuffleSampler',
    'OnlineClassifier', 'ClassifierPreprocessor', 'ClassificationTask',
    'StreamAccuracyMetric', 'load_weights', 'WideResNet',
    'wrn28_10_standard', 'wrn40_2_augmix', 'SmallCNN', 'SmallViT',
    'METHOD_NAMES', 'ECOTTA_PRESETS', 'ecotta_network', 'CLS_MODELS',
    'CLS_DATASETS', 'CLS_SCENARIOS'
]
