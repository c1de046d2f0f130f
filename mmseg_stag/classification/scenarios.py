"""Test streams of the paper's classification scenarios (§4.2-4.5).

A stream is a list of :class:`Stage`: consecutive batches (arrays of global
indices into a :class:`~mmseg_stag.classification.data.StreamData`) and
whether the model and the method are reset to the source state before the
stage. Shuffles are seeded: the same seed gives the same stream.

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
    """Consecutive batches of one stream segment.

    Args:
        name: the corruption, or ``'mixed'``.
        batches: arrays of global indices, in stream order.
        reset: restore the source model and rebuild the method first.
    """
    name: str
    batches: List[np.ndarray] = field(default_factory=list)
    reset: bool = False

    @property
    def num_samples(self) -> int:
        return int(sum(len(b) for b in self.batches))


def stage_rng(seed: int, stage: int) -> np.random.Generator:
    """The random generator of one stage (independent of the others)."""
    return np.random.default_rng([int(seed), int(stage)])


def split_batches(indices: np.ndarray, batch_size: int) -> List[np.ndarray]:
    """Consecutive batches; the last may be smaller (no sample dropped)."""
    if batch_size < 1:
        raise ValueError(f'batch_size must be >= 1, got {batch_size}')
    return [indices[i:i + batch_size]
            for i in range(0, len(indices), batch_size)]


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
    classes = np.unique(labels)
    if shuffle_class_order:
        classes = classes[rng.permutation(len(classes))]
    rank = np.empty(int(labels.max()) + 1, dtype=np.int64)
    rank[classes] = np.arange(len(classes))
    return indices[np.argsort(rank[labels], kind='stable')]


@CLS_SCENARIOS.register_module(name='per_corruption')
def per_corruption(data: StreamData,
                   seed: int = 0,
                   batch_size: int = 64,
                   order: str = 'shuffle',
                   reset: bool = True,
                   shuffle_class_order: bool = False,
                   n_per_corruption: Optional[int] = None) -> List[Stage]:
    """One stage per corruption, in the data's corruption order.

    Args:
        data: the corruption sets.
        seed: seed of the shuffles.
        batch_size: samples per step.
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
        stages.append(Stage(name, split_batches(idx, batch_size),
                            reset=reset or k == 0))
    return stages


@CLS_SCENARIOS.register_module(name='mild')
def mild(data: StreamData, seed: int = 0, batch_size: int = 64,
         **kwargs) -> List[Stage]:
    """Batch 64, one corruption at a time, shuffled, reset between them."""
    return per_corruption(data, seed, batch_size, order='shuffle',
                          reset=True, **kwargs)


@CLS_SCENARIOS.register_module(name='label_shift')
def label_shift(data: StreamData, seed: int = 0, batch_size: int = 64,
                shuffle_class_order: bool = True, **kwargs) -> List[Stage]:
    """Imbalance ratio inf: each corruption's stream sorted by class."""
    return per_corruption(data, seed, batch_size, order='class', reset=True,
                          shuffle_class_order=shuffle_class_order, **kwargs)


@CLS_SCENARIOS.register_module(name='batch_size_1')
def batch_size_1(data: StreamData, seed: int = 0, **kwargs) -> List[Stage]:
    """One sample per step, shuffled, reset between corruptions."""
    return per_corruption(data, seed, batch_size=1, order='shuffle',
                          reset=True, **kwargs)


@CLS_SCENARIOS.register_module(name='continual')
def continual(data: StreamData, seed: int = 0, batch_size: int = 200,
              order: str = 'file', **kwargs) -> List[Stage]:
    """Corruptions in sequence, never reset (CoTTA's CIFAR-C protocol: file
    order within a corruption)."""
    return per_corruption(data, seed, batch_size, order=order, reset=False,
                          **kwargs)


@CLS_SCENARIOS.register_module(name='mixed')
def mixed(data: StreamData, seed: int = 0, batch_size: int = 64,
          n_per_corruption: Optional[int] = None) -> List[Stage]:
    """All corruptions shuffled into one stream (one stage)."""
    parts = []
    for name in data.names:
        idx = data.indices_of(name)
        parts.append(idx if n_per_corruption is None
                     else idx[:n_per_corruption])
    idx = np.concatenate(parts)
    idx = idx[stage_rng(seed, 0).permutation(len(idx))]
    return [Stage('mixed', split_batches(idx, batch_size), reset=True)]


def build_stream(cfg: dict, data: StreamData, seed: int) -> List[Stage]:
    """Build the stages of ``cfg`` (``dict(type='mild', ...)``)."""
    cfg = dict(cfg)
    cfg.setdefault('seed', seed)
    return CLS_SCENARIOS.build(cfg, default_args=dict(data=data))
