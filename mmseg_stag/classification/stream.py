"""Classification streams as MMEngine datasets, and their samplers."""
from typing import Iterator, List, Optional, Sequence

import numpy as np
import torch
from mmengine.dataset import DefaultSampler
from mmengine.structures import BaseDataElement
from torch.utils.data import Dataset, Sampler

from mmseg_stag.engine.stream import StreamStage, dataset_stages, stage_of
from mmseg_stag.registry import DATA_SAMPLERS, DATASETS
from .data import CORRUPTIONS, StreamData, build_corruption_sets
from .registry import CLS_DATASETS
from .scenarios import build_stream


def classification_sample(image: torch.Tensor, label: int, **tags) -> dict:
    """Return ``dict(inputs, data_samples)`` with ``gt_label`` and the tags."""
    return dict(inputs=image,
                data_samples=BaseDataElement(
                    metainfo=dict(gt_label=int(label), **tags)))


@DATASETS.register_module()
class CorruptionStream(Dataset):
    """Corrupted test images in the order of a scenario, in one pass.

    Args:
        corruption_set (dict): A ``CLS_DATASETS`` config without the
            corruption, e.g. ``dict(type='CIFARC', data_root=...)``.
        corruptions (Sequence[str] | str): The corruptions, in stream
            order; a string is one corruption.
        scenario (dict, optional): A ``CLS_SCENARIOS`` config.
            Default: None (``dict(type='mild')``).
        shuffle_seed (int): Seed of the scenario's shuffles.
    """

    task = 'classification'

    def __init__(self,
                 corruption_set: dict,
                 corruptions: Sequence[str] = CORRUPTIONS,
                 scenario: Optional[dict] = None,
                 shuffle_seed: int = 1):
        if isinstance(corruptions, str):  # one corruption, not its letters
            corruptions = (corruptions, )
        self.data = StreamData(build_corruption_sets(
            dict(corruption_set, corruptions=list(corruptions))))
        #: the data indices in stream order; the stages over them
        self.order, self._stream_stages = build_stream(
            dict(scenario or dict(type='mild')), self.data, shuffle_seed)
        self.metainfo = dict(corruptions=list(self.data.names),
                             task=self.task)

    def __len__(self) -> int:
        return len(self.order)

    @staticmethod
    def first_stage_options(dataset_cfg: dict, corruption=None) -> dict:
        """Options of ``dataset_cfg`` that keep one stage: ``corruption``
        (default: the first), its images in the stream's order."""
        corruptions = dataset_cfg.get('corruptions', CORRUPTIONS)
        if isinstance(corruptions, str):  # as __init__ reads it
            corruptions = (corruptions, )
        return dict(corruptions=[corruption or corruptions[0]])

    @staticmethod
    def images_per_stage_options(num_images: int) -> dict:
        """Options that keep ``num_images`` images of each stage: of each
        corruption (the ``mixed`` scenario's one stage: of each of its
        corruptions)."""
        return {'corruption_set.n_examples': num_images}

    def stream_stages(self) -> List[StreamStage]:
        """Return the scenario's stages, one round."""
        return self._stream_stages

    def __getitem__(self, index: int) -> dict:
        image, label, domain = self.data.item(int(self.order[index]))
        return classification_sample(image, label,
                                     corruption=self.data.names[domain])


@DATASETS.register_module()
class SourceImages(Dataset):
    """Clean source images from a ``NumpyImages`` or ``ImageFolder`` config."""

    def __init__(self, images: dict):
        self.images = CLS_DATASETS.build(images)

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, index: int) -> dict:
        image, label = self.images[index]
        return classification_sample(image, label)


@DATA_SAMPLERS.register_module()
class StageBatchSampler(Sampler):
    """Batch sampler of consecutive samples of an in-order ``sampler`` that
    never spans two stages (a ValueError if the sampler shuffles)."""

    def __init__(self, sampler: Sampler, batch_size: int):
        if batch_size < 1:
            raise ValueError(f'batch_size must be >= 1, got {batch_size}')
        if isinstance(sampler, DefaultSampler) and sampler.shuffle:
            raise ValueError('StageBatchSampler needs the stream in order: '
                             'sampler=dict(type=\'DefaultSampler\', '
                             'shuffle=False)')
        self.sampler, self.batch_size = sampler, int(batch_size)
        self.stages = dataset_stages(sampler.dataset)
        self._len = None  # counted once: the loader asks for it every log

    def __iter__(self) -> Iterator[List[int]]:
        batch, stage = [], None
        for index in self.sampler:
            this = stage_of(self.stages, index).index
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
    """Sampler of a numpy ``default_rng(seed)`` permutation of the dataset."""

    def __init__(self, dataset, seed: Optional[int] = 0):
        self.dataset, self.seed = dataset, 0 if seed is None else int(seed)

    def __iter__(self) -> Iterator[int]:
        return iter(np.random.default_rng(self.seed).permutation(
            len(self.dataset)).tolist())

    def __len__(self) -> int:
        return len(self.dataset)
