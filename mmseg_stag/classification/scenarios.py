"""Test streams of the paper's classification scenarios (§4.2-4.5).

A stream is a list of :class:`Stage`: the global indices into a
:class:`~mmseg_stag.classification.data.StreamData` in stream order, and
whether the model and the method restart from the source state at the
stage. Shuffles are seeded: the same seed gives the same stream. The batch
size is the dataloader's (``StageBatchSampler`` cuts batches inside a
stage; the configs under ``configs/cls/_base_/scenarios`` set both).

=================  =====  ===================================  =============
scenario           batch  order                                reset
=================  =====  ===================================  =============
``mild``           64     one corruption at a time, shuffled   every stage
``label_shift``    64     one corruption at a time, sorted by  every stage
                          class (imbalance ratio = inf)
``batch_size_1``   1      one corruption at a time, shuffled   every stage
``mixed``          64     all corruptions in one shuffled      once
                          stream
``continual``      200    corruptions in sequence, file order  never (only
                                                               at the start)
=================  =====  ===================================  =============

"Reset every stage" is the SAR/DeYO/EATA protocol of the ImageNet-C
tables: each corruption is a separate run from the source model.
"""
from dataclasses import dataclass, field
from typing import List, Optional

import numpy as np

from .data import StreamData
from .registry import CLS_SCENARIOS

ORDERS = ('shuffle', 'file', 'class')


@dataclass
class Stage:
    """One stream segment.

    Args:
        name: the corruption, or ``'mixed'``.
        indices: global indices, in stream order.
        reset: restart from the source model and a fresh method.
    """
    name: str
    indices: np.ndarray = field(
        default_factory=lambda: np.zeros(0, dtype=np.int64))
    reset: bool = False


def stage_rng(seed: int, stage: int) -> np.random.Generator:
    """The random generator of one stage (independent of the others)."""
    return np.random.default_rng([int(seed), int(stage)])


def order_indices(indices: np.ndarray, labels: np.ndarray, order: str,
                  rng: np.random.Generator,
                  shuffle_class_order: bool = False) -> np.ndarray:
    """Arrange one stage's indices.

    Args:
        indices: global indices in file order.
        labels: their labels.
        order: ``'shuffle'`` (seeded permutation), ``'file'`` (as given) or
            ``'class'`` (all samples of a class together, file order within
            a class; classes ascending or, with ``shuffle_class_order``, in
            a seeded random order as in SAR's label-shift streams).
        rng: the stage's generator.
    """
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
    classes = np.unique(labels)
    if shuffle_class_order:
        classes = classes[rng.permutation(len(classes))]
    rank = np.empty(int(labels.max()) + 1, dtype=np.int64)
    rank[classes] = np.arange(len(classes))
    return indices[np.argsort(rank[labels], kind='stable')]


@CLS_SCENARIOS.register_module(name='per_corruption')
def per_corruption(data: StreamData,
                   seed: int = 0,
                   order: str = 'shuffle',
                   reset: bool = True,
                   shuffle_class_order: bool = False,
                   n_per_corruption: Optional[int] = None) -> List[Stage]:
    """One stage per corruption, in the data's corruption order.

    Args:
        data: the corruption sets.
        seed: seed of the shuffles.
        order: see :func:`order_indices`.
        reset: reset before every stage (``False``: only before the first).
        shuffle_class_order: see :func:`order_indices`.
        n_per_corruption: keep only the first ``n`` samples of each stage
            (after ordering); ``None``: all.
    """
    stages = []
    for k, name in enumerate(data.names):
        idx = data.indices_of(name)
        idx = order_indices(idx, data.labels[idx], order, stage_rng(seed, k),
                            shuffle_class_order)
        if n_per_corruption is not None:
            idx = idx[:n_per_corruption]
        stages.append(Stage(name, idx, reset=reset or k == 0))
    return stages


@CLS_SCENARIOS.register_module(name='mild')
def mild(data: StreamData, seed: int = 0, **kwargs) -> List[Stage]:
    """One corruption at a time, shuffled, reset between them."""
    return per_corruption(data, seed, order='shuffle', reset=True, **kwargs)


@CLS_SCENARIOS.register_module(name='label_shift')
def label_shift(data: StreamData, seed: int = 0,
                shuffle_class_order: bool = True, **kwargs) -> List[Stage]:
    """Imbalance ratio inf: each corruption's stream sorted by class."""
    return per_corruption(data, seed, order='class', reset=True,
                          shuffle_class_order=shuffle_class_order, **kwargs)


@CLS_SCENARIOS.register_module(name='batch_size_1')
def batch_size_1(data: StreamData, seed: int = 0, **kwargs) -> List[Stage]:
    """Shuffled, reset between corruptions (the mild order; the
    dataloader's batch size is 1)."""
    return per_corruption(data, seed, order='shuffle', reset=True, **kwargs)


@CLS_SCENARIOS.register_module(name='continual')
def continual(data: StreamData, seed: int = 0, order: str = 'file',
              **kwargs) -> List[Stage]:
    """Corruptions in sequence, never reset (CoTTA's CIFAR-C protocol: file
    order within a corruption)."""
    return per_corruption(data, seed, order=order, reset=False, **kwargs)


@CLS_SCENARIOS.register_module(name='mixed')
def mixed(data: StreamData, seed: int = 0,
          n_per_corruption: Optional[int] = None) -> List[Stage]:
    """All corruptions shuffled into one stream (one stage)."""
    parts = []
    for name in data.names:
        idx = data.indices_of(name)
        parts.append(idx if n_per_corruption is None
                     else idx[:n_per_corruption])
    idx = np.concatenate(parts)
    idx = idx[stage_rng(seed, 0).permutation(len(idx))]
    return [Stage('mixed', idx, reset=True)]


def build_stream(cfg: dict, data: StreamData, seed: int) -> List[Stage]:
    """Build the stages of ``cfg`` (``dict(type='mild', ...)``)."""
    cfg = dict(cfg)
    cfg.setdefault('seed', seed)
    return CLS_SCENARIOS.build(cfg, default_args=dict(data=data))
