"""The paper's reported scores: the Avg. column of each results table."""
from typing import List, Optional, Tuple

#: (benchmark, scenario, model, method, baseline, +STAG or None where the
#: paper has no +STAG row); ACDC: mean mIoU over the 40 stages
#: (Table acdc_continual), ImageNet-C: accuracy % (Tables mild,
#: mix_shifts_avg, label_shifts_bs1), CIFAR-C: error % (Table
#: continual_tta), each averaged over the 15 corruptions.
PAPER_RESULTS: List[Tuple[str, str, str, str, float, Optional[float]]] = [
    ('acdc', 'continual', 'segformer-b5', 'source', 56.7, None),
    ('acdc', 'continual', 'segformer-b5', 'bn_adapt', 51.6, 52.4),
    ('acdc', 'continual', 'segformer-b5', 'tent', 52.4, 57.2),
    ('imagenet-c', 'mild', 'resnet50-bn', 'source', 18.0, None),
    ('imagenet-c', 'mild', 'resnet50-bn', 'tent', 42.7, 44.7),
    ('imagenet-c', 'mild', 'resnet50-bn', 'eata', 47.7, 48.6),
    ('imagenet-c', 'mild', 'resnet50-bn', 'sar', 43.8, 46.1),
    ('imagenet-c', 'mild', 'resnet50-bn', 'deyo', 48.5, 48.6),
    ('imagenet-c', 'mild', 'resnet50-gn', 'source', 30.6, None),
    ('imagenet-c', 'mild', 'resnet50-gn', 'tent', 24.9, None),
    ('imagenet-c', 'mild', 'resnet50-gn', 'eata', 45.4, 52.3),
    ('imagenet-c', 'mild', 'resnet50-gn', 'sar', 36.9, 41.9),
    ('imagenet-c', 'mild', 'resnet50-gn', 'deyo', 44.5, 46.8),
    ('imagenet-c', 'mild', 'vit-b16', 'source', 29.9, None),
    ('imagenet-c', 'mild', 'vit-b16', 'tent', 48.0, 59.2),
    ('imagenet-c', 'mild', 'vit-b16', 'eata', 61.5, 65.4),
    ('imagenet-c', 'mild', 'vit-b16', 'sar', 55.8, 64.5),
    ('imagenet-c', 'mild', 'vit-b16', 'deyo', 63.7, 66.0),
    ('imagenet-c', 'label-shift', 'resnet50-gn', 'source', 30.6, None),
    ('imagenet-c', 'label-shift', 'resnet50-gn', 'tent', 21.6, None),
    ('imagenet-c', 'label-shift', 'resnet50-gn', 'eata', 32.6, 39.9),
    ('imagenet-c', 'label-shift', 'resnet50-gn', 'sar', 36.3, 37.8),
    ('imagenet-c', 'label-shift', 'resnet50-gn', 'deyo', 41.8, 41.5),
    ('imagenet-c', 'label-shift', 'vit-b16', 'source', 29.9, None),
    ('imagenet-c', 'label-shift', 'vit-b16', 'tent', 47.0, 50.4),
    ('imagenet-c', 'label-shift', 'vit-b16', 'eata', 48.4, 49.1),
    ('imagenet-c', 'label-shift', 'vit-b16', 'sar', 57.4, 63.2),
    ('imagenet-c', 'label-shift', 'vit-b16', 'deyo', 61.6, 64.3),
    ('imagenet-c', 'mixed', 'resnet50-gn', 'source', 30.6, None),
    ('imagenet-c', 'mixed', 'vit-b16', 'source', 29.9, None),
    ('imagenet-c', 'mixed', 'resnet50-gn', 'tent', 13.3, None),
    ('imagenet-c', 'mixed', 'vit-b16', 'tent', 15.8, None),
    ('imagenet-c', 'mixed', 'resnet50-gn', 'eata', 38.0, 39.4),
    ('imagenet-c', 'mixed', 'vit-b16', 'eata', 56.5, 57.8),
    ('imagenet-c', 'mixed', 'resnet50-gn', 'sar', 38.3, 38.9),
    ('imagenet-c', 'mixed', 'vit-b16', 'sar', 57.1, 59.8),
    ('imagenet-c', 'mixed', 'resnet50-gn', 'deyo', 38.0, 38.8),
    ('imagenet-c', 'mixed', 'vit-b16', 'deyo', 58.9, 59.7),
    ('imagenet-c', 'bs1', 'resnet50-gn', 'source', 30.6, None),
    ('imagenet-c', 'bs1', 'resnet50-gn', 'tent', 21.5, None),
    ('imagenet-c', 'bs1', 'resnet50-gn', 'eata', 36.3, 47.0),
    ('imagenet-c', 'bs1', 'resnet50-gn', 'sar', 34.4, 44.2),
    ('imagenet-c', 'bs1', 'resnet50-gn', 'deyo', 41.3, 46.2),
    ('imagenet-c', 'bs1', 'vit-b16', 'source', 29.9, None),
    ('imagenet-c', 'bs1', 'vit-b16', 'tent', 47.8, 58.4),
    ('imagenet-c', 'bs1', 'vit-b16', 'eata', 47.4, 59.2),
    ('imagenet-c', 'bs1', 'vit-b16', 'sar', 56.6, 65.5),
    ('imagenet-c', 'bs1', 'vit-b16', 'deyo', 62.8, 63.1),
    ('cifar10-c', 'continual', 'wrn-28-10', 'source', 43.5, None),
    ('cifar10-c', 'continual', 'wrn-28-10', 'bn_adapt', 20.4, 17.9),
    ('cifar10-c', 'continual', 'wrn-28-10', 'tent', 19.0, 17.4),
    ('cifar10-c', 'continual', 'wrn-28-10', 'cotta', 16.3, 16.1),
    ('cifar10-c', 'continual', 'wrn-28-10', 'ecotta-k4', 17.9, 17.5),
    ('cifar10-c', 'continual', 'wrn-28-10', 'ecotta-k5', 18.0, 17.6),
    ('cifar100-c', 'continual', 'wrn-40-2', 'source', 46.8, None),
    ('cifar100-c', 'continual', 'wrn-40-2', 'bn_adapt', 39.3, 36.7),
    ('cifar100-c', 'continual', 'wrn-40-2', 'tent', 37.2, 35.4),
    ('cifar100-c', 'continual', 'wrn-40-2', 'cotta', 38.1, 37.4),
    ('cifar100-c', 'continual', 'wrn-40-2', 'ecotta-k4', 36.8, 36.6),
    ('cifar100-c', 'continual', 'wrn-40-2', 'ecotta-k5', 36.8, 36.7),
]

#: the score each benchmark reports, and whether lower is better
METRICS = {'acdc': ('mIoU', False), 'imagenet-c': ('acc', False),
           'cifar10-c': ('err', True), 'cifar100-c': ('err', True)}


def paper_result(benchmark: str, scenario: str, model: str, method: str,
                 stag: bool) -> Optional[float]:
    """The paper's score of one setting, None where the paper has none."""
    for b, s, m, base, plain, with_stag in PAPER_RESULTS:
        if (b, s, m, base) == (benchmark, scenario, model, method):
            return with_stag if stag else plain
    return None
