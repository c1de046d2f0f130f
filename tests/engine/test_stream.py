"""The stream's stages (``mmseg_stag/engine/stream.py``): declared once by
the dataset, turned into per-batch positions once by the loop's schedule."""
import pytest

from mmseg_stag.engine.stream import (StreamSchedule, StreamStage,
                                      dataset_stages, stage_of,
                                      stages_from_tags)

STAGES = [StreamStage(0, 1, 'fog', 0, 3, from_source=True),
          StreamStage(1, 1, 'night', 3, 5),
          StreamStage(2, 2, 'fog', 5, 6, from_source=True)]


class Tiled:
    """A dataset of ``n`` samples declaring ``stages``."""

    def __init__(self, n, stages):
        self.n, self.stages = n, stages

    def __len__(self):
        return self.n

    def stream_stages(self):
        return self.stages


def test_stages_from_tags_groups_consecutive_samples():
    infos = [dict(stage=s.index, round=s.round, condition=s.condition,
                  from_source=s.from_source) for s in STAGES
             for _ in range(s.start, s.stop)]
    assert stages_from_tags(infos) == STAGES
    assert stages_from_tags([]) == []


def test_dataset_stages_are_checked():
    assert dataset_stages(Tiled(6, STAGES)) == STAGES
    assert dataset_stages(list(range(4))) == [StreamStage(0, 1, 'all', 0, 4)]
    with pytest.raises(ValueError, match='covers 6 samples.*has 7'):
        dataset_stages(Tiled(7, STAGES))
    gap = [STAGES[0], StreamStage(1, 1, 'night', 4, 6)]
    with pytest.raises(ValueError, match='tile the samples'):
        dataset_stages(Tiled(6, gap))
    renumbered = [STAGES[0], StreamStage(5, 1, 'night', 3, 6)]
    with pytest.raises(ValueError, match='numbered 0, 1'):
        dataset_stages(Tiled(6, renumbered))


def test_stage_of():
    assert [stage_of(STAGES, i).index for i in range(6)] == [0, 0, 0, 1, 1,
                                                             2]
    with pytest.raises(IndexError):
        stage_of(STAGES, 6)


def test_schedule_marks_stage_starts_and_ends():
    schedule = StreamSchedule(STAGES, [[0, 1], [2], [3, 4], [5]])
    assert [(p.stage.index, p.starts, p.ends) for p in schedule.positions] \
        == [(0, True, False), (0, False, True), (1, True, True),
            (2, True, True)]
    assert schedule.restarts_from_source and len(schedule) == 4
    calm = [StreamStage(0, 1, 'all', 0, 2)]
    assert not StreamSchedule(calm, [[0], [1]]).restarts_from_source


def test_schedule_refuses_batches_across_stages_and_shuffles():
    with pytest.raises(ValueError, match=r'spans the stages \[0, 1\]'):
        StreamSchedule(STAGES, [[0, 1, 2, 3], [4, 5]])
    with pytest.raises(ValueError, match='comes back'):
        StreamSchedule(STAGES, [[0], [3], [1], [2], [4], [5]])
