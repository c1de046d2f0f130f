"""Test streams of the paper's classification scenarios: each is the
order of the stream's samples (indices into the data) and its stages, the
``StreamStage`` s the loop reads for either task."""
from typing import List, Optional, Sequence, Tuple

import numpy as np

from mmseg_stag.engine.stream import StreamStage
from .data import StreamData
from .registry import CLS_SCENARIOS

ORDERS = ('shuffle', 'file', 'class')
#: a scenario's stream: the data indices in stream order, and its stages
Stream = Tuple[np.ndarray, List[StreamStage]]


def stream_of(parts: Sequence[Tuple[str, np.ndarray, bool]]) -> Stream:
    """The stream of ``parts`` in order, each ``(corruption or 'mixed',
    its data indices in stream order, whether it starts from the
    source)``: one stage a part, one round."""
    order = np.concatenate([indices for _, indices, _ in parts])
    stages, start = [], 0
    for k, (name, indices, from_source) in enumerate(parts):
        stages.append(StreamStage(k, 1, name, start, start + len(indices),
                                  bool(from_source)))
        start += len(indices)
    return order, stages


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
                   n_per_corruption: Optional[int] = None) -> Stream:
    """One stage per corruption, in the data's order, each ordered by
    :func:`order_indices` and cut to ``n_per_corruption``; every stage from
    the source if ``from_source``, else only the first."""
    parts = []
    for k, name in enumerate(data.names):
        idx = data.indices_of(name)
        idx = order_indices(idx, data.labels[idx], order, stage_rng(seed, k),
                            shuffle_class_order)[:n_per_corruption]
        parts.append((name, idx, from_source or k == 0))
    return stream_of(parts)


@CLS_SCENARIOS.register_module(name='mild')
def mild(data: StreamData, seed: int = 0, **kwargs) -> Stream:
    """One corruption at a time, shuffled, each from the source (bs1 too)."""
    return per_corruption(data, seed, order='shuffle', from_source=True,
                          **kwargs)


@CLS_SCENARIOS.register_module(name='label-shift')
def label_shift(data: StreamData, seed: int = 0,
                shuffle_class_order: bool = True, **kwargs) -> Stream:
    """Imbalance ratio inf: each corruption's stream sorted by class."""
    return per_corruption(data, seed, order='class', from_source=True,
                          shuffle_class_order=shuffle_class_order, **kwargs)


@CLS_SCENARIOS.register_module(name='continual')
def continual(data: StreamData, seed: int = 0, order: str = 'file',
              **kwargs) -> Stream:
    """Corruptions in sequence, only the first from the source (CoTTA's)."""
    return per_corruption(data, seed, order=order, from_source=False,
                          **kwargs)


@CLS_SCENARIOS.register_module(name='mixed')
def mixed(data: StreamData, seed: int = 0,
          n_per_corruption: Optional[int] = None) -> Stream:
    """All corruptions shuffled into one stream (one stage)."""
    idx = np.concatenate([data.indices_of(name)[:n_per_corruption]
                          for name in data.names])
    idx = idx[stage_rng(seed, 0).permutation(len(idx))]
    return stream_of([('mixed', idx, True)])


def build_stream(cfg: dict, data: StreamData, seed: int) -> Stream:
    """Build the stream of ``cfg`` (``dict(type='mild', ...)``): the data
    indices in stream order and the stages."""
    cfg = dict(cfg)
    if cfg.get('type') == 'label_shift':  # refused, naming the spelling
        raise KeyError("scenario type 'label_shift' is spelt 'label-shift' "
                       '(as in the config file names); rename it in '
                       'test_dataloader.dataset.scenario.type')
    cfg.setdefault('seed', seed)
    return CLS_SCENARIOS.build(cfg, default_args=dict(data=data))
