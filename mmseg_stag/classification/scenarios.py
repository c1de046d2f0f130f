"""Test streams of the paper's classification scenarios, as lists of stages."""
from dataclasses import dataclass
from typing import List, Optional

import numpy as np

from .data import StreamData
from .registry import CLS_SCENARIOS

ORDERS = ('shuffle', 'file', 'class')


@dataclass
class Stage:
    """One stream segment: its corruption (or ``'mixed'``), its global
    indices in stream order, and ``StreamStage.from_source``."""
    name: str
    indices: np.ndarray
    from_source: bool = False


def stage_rng(seed: int, stage: int) -> np.random.Generator:
    """Return the random generator of one stage."""
    return np.random.default_rng([int(seed), int(stage)])


def order_indices(indices: np.ndarray, labels: np.ndarray, order: str,
                  rng: np.random.Generator,
                  shuffle_class_order: bool = False) -> np.ndarray:
    """Return one stage's indices (file order) in ``order``: ``'file'``,
    ``'shuffle'`` or ``'class'`` (the classes in random order if
    ``shuffle_class_order``, as SAR's label-shift streams)."""
    if order not in ORDERS:
        raise ValueError(f'order must be one of {ORDERS}, got {order!r}')
    if order == 'file':
        return indices
    if order == 'shuffle':
        return indices[rng.permutation(len(indices))]
    if len(labels) and labels.min() < 0:
        raise ValueError('a class-ordered stream (label shift) needs the '
                         'labels of its images; this data has unlabelled '
                         'images (label < 0)')
    classes, rank = np.unique(labels, return_inverse=True)
    if shuffle_class_order:
        rank = np.argsort(rng.permutation(len(classes)))[rank]
    return indices[np.argsort(rank, kind='stable')]


@CLS_SCENARIOS.register_module(name='per_corruption')
def per_corruption(data: StreamData,
                   seed: int = 0,
                   order: str = 'shuffle',
                   from_source: bool = True,
                   shuffle_class_order: bool = False,
                   n_per_corruption: Optional[int] = None) -> List[Stage]:
    """One stage per corruption, in the data's order, each ordered by
    :func:`order_indices` and cut to ``n_per_corruption``; every stage from
    the source if ``from_source``, else only the first."""
    stages = []
    for k, name in enumerate(data.names):
        idx = data.indices_of(name)
        idx = order_indices(idx, data.labels[idx], order, stage_rng(seed, k),
                            shuffle_class_order)[:n_per_corruption]
        stages.append(Stage(name, idx, from_source=from_source or k == 0))
    return stages


@CLS_SCENARIOS.register_module(name='mild')
def mild(data: StreamData, seed: int = 0, **kwargs) -> List[Stage]:
    """One corruption at a time, shuffled, each from the source (bs1 too)."""
    return per_corruption(data, seed, order='shuffle', from_source=True,
                          **kwargs)


@CLS_SCENARIOS.register_module(name='label-shift')
def label_shift(data: StreamData, seed: int = 0,
                shuffle_class_order: bool = True, **kwargs) -> List[Stage]:
    """Imbalance ratio inf: each corruption's stream sorted by class."""
    return per_corruption(data, seed, order='class', from_source=True,
                          shuffle_class_order=shuffle_class_order, **kwargs)


@CLS_SCENARIOS.register_module(name='continual')
def continual(data: StreamData, seed: int = 0, order: str = 'file',
              **kwargs) -> List[Stage]:
    """Corruptions in sequence, only the first from the source (CoTTA's)."""
    return per_corruption(data, seed, order=order, from_source=False,
                          **kwargs)


@CLS_SCENARIOS.register_module(name='mixed')
def mixed(data: StreamData, seed: int = 0,
          n_per_corruption: Optional[int] = None) -> List[Stage]:
    """All corruptions shuffled into one stream (one stage)."""
    idx = np.concatenate([data.indices_of(name)[:n_per_corruption]
                          for name in data.names])
    idx = idx[stage_rng(seed, 0).permutation(len(idx))]
    return [Stage('mixed', idx, from_source=True)]


def build_stream(cfg: dict, data: StreamData, seed: int) -> List[Stage]:
    """Build the stages of ``cfg`` (``dict(type='mild', ...)``)."""
    cfg = dict(cfg)
    if cfg.get('type') == 'label_shift':  # refused, naming the spelling
        raise KeyError("scenario type 'label_shift' is spelt 'label-shift' "
                       '(as in the config file names); rename it in '
                       'test_dataloader.dataset.scenario.type')
    cfg.setdefault('seed', seed)
    return CLS_SCENARIOS.build(cfg, default_args=dict(data=data))
