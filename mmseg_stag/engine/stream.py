"""The stages of an online stream, declared once by its dataset
(``stream_stages()``) and turned into per-batch stage events by
:class:`StreamSchedule` alone."""
import bisect
from dataclasses import dataclass, replace
from typing import List, Sequence


@dataclass(frozen=True)
class StreamStage:
    """One stage of a stream: consecutive samples of one condition."""
    index: int  # its position in the stream (0, 1, ...)
    round: int  # the round of a repeated cycle (1, 2, ...)
    condition: str  # ACDC condition or corruption ('mixed': all of them)
    start: int  # its first sample index
    stop: int  # one past its last sample index
    # whether it starts from the source weights (restart_from_source)
    from_source: bool = False

    def tags(self) -> dict:
        """Return ``stage``, ``round``, ``condition``: a record's tags."""
        return dict(stage=self.index, round=self.round,
                    condition=self.condition)


def dataset_stages(dataset) -> List[StreamStage]:
    """Return the dataset's checked ``stream_stages()``, else one stage
    (``ValueError`` if they do not tile the samples in order)."""
    if not hasattr(dataset, 'stream_stages'):  # one stage of all samples
        return [StreamStage(0, 1, 'all', 0, len(dataset))]
    stages = list(dataset.stream_stages())
    where = f'{type(dataset).__name__}.stream_stages()'
    stop = 0
    for k, stage in enumerate(stages):
        if stage.index != k or stage.start != stop or stage.stop <= stop:
            raise ValueError(f'{where}: stage {k} is {stage}; stages must '
                             'be numbered 0, 1, ... and tile the samples in '
                             'order, each non-empty')
        stop = stage.stop
    if stop != len(dataset):
        raise ValueError(f'{where} covers {stop} samples, the dataset has '
                         f'{len(dataset)}')
    return stages


def stages_from_tags(infos: Sequence[dict]) -> List[StreamStage]:
    """Return the stages of data infos tagged ``stage``/``round``/``condition``
    (``KeyError`` if an info lacks a tag)."""
    stages: List[StreamStage] = []
    for i, info in enumerate(infos):
        index = int(info['stage'])
        if stages and stages[-1].index == index:
            continue
        if stages:
            stages[-1] = replace(stages[-1], stop=i)
        stages.append(StreamStage(index, int(info['round']),
                                  str(info['condition']), i, i + 1,
                                  bool(info.get('from_source', False))))
    if stages:
        stages[-1] = replace(stages[-1], stop=len(infos))
    return stages


def stage_of(stages: Sequence[StreamStage], index: int) -> StreamStage:
    """Return the stage holding sample ``index``."""
    k = bisect.bisect_right([s.start for s in stages], int(index)) - 1
    if k < 0 or index >= stages[k].stop:
        raise IndexError(f'sample {index} is in no stage')
    return stages[k]


@dataclass(frozen=True)
class BatchPosition:
    """Where a batch is in the stream: its stage, whether it is the
    stage's first batch (``starts``) and last (``ends``)."""
    stage: StreamStage
    starts: bool
    ends: bool


class StreamSchedule:
    """The stage position of every batch of ``batch_sampler`` (batches of
    sample indices, in stream order), computed once (``ValueError`` if a
    batch spans two stages or a stage comes back)."""

    def __init__(self, stages: Sequence[StreamStage], batch_sampler):
        per_batch = []
        for indices in batch_sampler:
            found = {stage_of(stages, int(i)).index for i in indices}
            if len(found) > 1:
                raise ValueError(
                    f'a batch spans the stages {sorted(found)}; use batch '
                    'size 1 or a stage-aligned batch sampler '
                    '(StageBatchSampler)')
            per_batch.append(stages[found.pop()])
        self.positions: List[BatchPosition] = []
        seen = set()
        for k, stage in enumerate(per_batch):
            starts = k == 0 or per_batch[k - 1] is not stage
            ends = k + 1 == len(per_batch) or per_batch[k + 1] is not stage
            if starts and stage.index in seen:
                raise ValueError(f'stage {stage.index} ({stage.condition}) '
                                 'comes back after another stage: the '
                                 'sampler must keep the stream in order')
            seen.add(stage.index)
            self.positions.append(BatchPosition(stage, starts, ends))

    def __len__(self) -> int:
        return len(self.positions)

    def __getitem__(self, idx: int) -> BatchPosition:
        return self.positions[idx]

    @property
    def restarts_from_source(self) -> bool:
        """Whether a stage starts from the source weights."""
        return any(p.stage.from_source and p.starts
                   for p in self.positions)
