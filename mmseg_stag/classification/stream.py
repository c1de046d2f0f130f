"""Classification streams as MMEngine datasets: corrupted test sets in the
order of a scenario, every sample tagged with its stage, and the samplers
that batch them (stage-aligned) and shuffle EATA's clean source images."""
from typing import Iterator, List, Optional, Sequence

import numpy as np
import torch
from mmengine.dataset import DefaultSampler
from mmengine.structures import BaseDataElement
from torch.utils.data import Dataset, Sampler

from mmseg_stag.registry import DATA_SAMPLERS, DATASETS
from .data import CORRUPTIONS, StreamData, build_corruption_sets
from .registry import CLS_DATASETS
from .scenarios import build_stream


def classification_sample(image: torch.Tensor, label: int, **tags) -> dict:
    """``dict(inputs, data_samples)``: a uint8 ``[3, H, W]`` image and its
    data sample (``gt_label`` and the stream tags as metainfo)."""
    return dict(inputs=image,
                data_samples=BaseDataElement(
                    metainfo=dict(gt_label=int(label), **tags)))


@DATASETS.register_module()
class CorruptionStream(Dataset):
    """Corrupted test images in the order of a scenario (one pass).

    Item ``i`` is the ``i``-th image of the stream; its data sample carries
    ``gt_label`` and the tags ``stage`` (0-based), ``round`` (1),
    ``condition`` (the stage's name: a corruption, or ``'mixed'``),
    ``corruption`` (the image's own) and ``reset`` (the stage restarts from
    the source model).

    Args:
        corruption_set (dict): a ``CLS_DATASETS`` config without the
            corruption (``CIFARC``, ``ImageNetC``), e.g.
            ``dict(type='CIFARC', data_root='data/CIFAR-10-C', severity=5)``.
        corruptions (Sequence[str]): the corruptions, in stream order.
            Default: the 15 of ImageNet-C.
        scenario (dict): a ``CLS_SCENARIOS`` config, e.g.
            ``dict(type='mild')``, ``dict(type='label_shift')``.
        shuffle_seed (int): seed of the scenario's shuffles. Default: 1.
    """

    task = 'classification'

    def __init__(self,
                 corruption_set: dict,
                 corruptions: Sequence[str] = CORRUPTIONS,
                 scenario: Optional[dict] = None,
                 shuffle_seed: int = 1):
        if not corruptions:
            raise ValueError('test_dataloader.dataset.corruptions is empty')
        self.data = StreamData(build_corruption_sets(
            dict(corruption_set, corruptions=list(corruptions))))
        self.stages = build_stream(dict(scenario or dict(type='mild')),
                                   self.data, shuffle_seed)
        self.order = np.concatenate([s.indices for s in self.stages])
        self.stage_index = np.repeat(
            np.arange(len(self.stages)), [len(s.indices) for s in self.stages])
        self.metainfo = dict(corruptions=list(self.data.names),
                             task=self.task)

    def __len__(self) -> int:
        return len(self.order)

    def stage_of(self, index: int):
        """``(stage, reset)`` of item ``index``."""
        k = int(self.stage_index[index])
        return k, self.stages[k].reset

    def __getitem__(self, index: int) -> dict:
        k = int(self.stage_index[index])
        image, label, domain = self.data.item(int(self.order[index]))
        return classification_sample(
            image, label, stage=k, round=1, condition=self.stages[k].name,
            corruption=self.data.names[domain], reset=self.stages[k].reset)


@DATASETS.register_module()
class SourceImages(Dataset):
    """Clean source-domain images (EATA's Fisher information), from a
    ``CLS_DATASETS`` config: ``NumpyImages`` or ``ImageFolder``."""

    def __init__(self, images: dict):
        self.images = CLS_DATASETS.build(images)

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, index: int) -> dict:
        image, label = self.images[index]
        return classification_sample(image, label)


@DATA_SAMPLERS.register_module()
class StageBatchSampler(Sampler):
    """Batches of ``batch_size`` consecutive samples that never span two
    stages (the last batch of a stage may be smaller).

    Args:
        sampler (Sampler): an in-order sampler of the stream (MMEngine's
            ``DefaultSampler(shuffle=False)``).
        batch_size (int): samples per batch.
    """

    def __init__(self, sampler: Sampler, batch_size: int):
        if batch_size < 1:
            raise ValueError(f'batch_size must be >= 1, got {batch_size}')
        if isinstance(sampler, DefaultSampler) and sampler.shuffle:
            raise ValueError('StageBatchSampler needs the stream in order: '
                             'sampler=dict(type=\'DefaultSampler\', '
                             'shuffle=False)')
        self.sampler, self.batch_size = sampler, int(batch_size)
        self.dataset = sampler.dataset
        self._len = None  # counted once: the loader asks for it every log

    def __iter__(self) -> Iterator[List[int]]:
        batch, stage = [], None
        for index in self.sampler:
            this = self.dataset.stage_of(index)[0]
            if batch and (this != stage or len(batch) == self.batch_size):
                yield batch
                batch = []
            batch.append(index)
            stage = this
        if batch:
            yield batch

    def __len__(self) -> int:
        if self._len is None:
            self._len = sum(1 for _ in self)
        return self._len


@DATA_SAMPLERS.register_module()
class SeededShuffleSampler(Sampler):
    """A numpy-seeded permutation of the dataset (``default_rng(seed)``), the
    order of EATA's shuffled Fisher loader in this project since its first
    classification release (kept so results stay comparable)."""

    def __init__(self, dataset, seed: Optional[int] = 0):
        self.dataset, self.seed = dataset, 0 if seed is None else int(seed)

    def __iter__(self) -> Iterator[int]:
        order = np.random.default_rng(self.seed).permutation(
            len(self.dataset))
        return iter(order.tolist())

    def __len__(self) -> int:
        return len(self.dataset)
