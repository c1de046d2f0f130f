"""``OnlineInferencer(realtime=...)``: the realistic online protocol of
``tools/test.py --realtime`` (docs/realtime.md) on frames. The schedule
(cost 2.5: frames 0, 3, 6, … adapt, counted again at each stage's first
frame); a frame predicted only leaves the weights as they were and has no
step statistics; ``cost=1`` is the run without the option to the bit; a
measured cost is saved with the state and a resumed stream keeps it, not
measured again."""
import numpy as np
import pytest
import torch
from frame_helpers import benchmark_predictions
from test_online_inferencer import inferencer

from mmseg_stag.engine.online_loop import OnlineAdaptationLoop


@pytest.fixture
def paths(tiny_acdc, tiny_checkpoint, tmp_path):
    """The tiny stream's 8 frames, in its order."""
    return [p for p, _ in benchmark_predictions(
        'tent-stag', tiny_acdc, tiny_checkpoint, tmp_path / 'test')]


def weights(adapt):
    return {k: v.clone() for k, v in adapt.model.state_dict().items()}


def same(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize('stage_frames, want', [
    (None, [True, False, False] * 2 + [True, False]),
    (4, [True, False, False, True] * 2),
    (2, [True, False] * 4)])
def test_the_schedule_on_frames_and_a_frame_predicted_only_changes_nothing(
        stage_frames, want, paths, tiny_acdc, tiny_checkpoint, tmp_path):
    adapt = inferencer('tent-stag', tiny_acdc, tiny_checkpoint, tmp_path,
                       stage_frames=stage_frames, realtime=2.5)
    assert adapt.loop.realtime.cost == 2.5
    adapted = []
    for path in paths:
        before = weights(adapt)
        sample, stats = adapt.step(adapt.load_frame(path), name=path)
        adapted.append(stats['adapted'])
        assert sample.metainfo['adapted'] is stats['adapted']
        # a step changes the weights; a frame predicted only does not,
        # and has no step statistics
        assert same(before, weights(adapt)) != stats['adapted'], path
        assert ('loss' in stats) == stats['adapted']
        assert stats['reset'] is None
    assert adapted == want
    assert adapt.adapted == sum(want) and adapt.frames == 8
    loop = adapt.loop
    assert loop.num_updates + loop.method.num_updates == sum(want)
    assert adapt.realtime_record() == dict(
        cost=2.5, how='given', period=3, batches_adapted=sum(want),
        batches_predicted_only=8 - sum(want), measured=None)
    adapt.close()


def test_cost_one_is_the_run_without_realtime_to_the_bit(
        paths, tiny_acdc, tiny_checkpoint, tmp_path):
    runs = {}
    for name, realtime in (('offline', None), ('rt', 1)):
        adapt = inferencer('tent-stag', tiny_acdc, tiny_checkpoint,
                           tmp_path / name, realtime=realtime)
        steps = [adapt.step(adapt.load_frame(p)) for p in paths]
        runs[name] = ([s.pred_sem_seg.data.numpy() for s, _ in steps],
                      [{k: v for k, v in stats.items() if k != 'adapted'}
                       for _, stats in steps], weights(adapt), adapt)
    (labels, stats, final, offline), (labels1, stats1, final1, rt) = \
        runs['offline'], runs['rt']
    assert all(np.array_equal(a, b) for a, b in zip(labels, labels1))
    assert stats == stats1 and same(final, final1)
    assert offline.realtime_record() is None
    assert rt.realtime_record()['batches_adapted'] == 8
    for adapt in (offline, rt):
        adapt.close()


def test_a_measured_cost_is_kept_by_a_resumed_stream(
        paths, tiny_acdc, tiny_checkpoint, tmp_path, monkeypatch):
    """Measured on the first frame (the model, the method and the random
    states restored), saved with the state; the stream loaded from it
    measures nothing and goes on as the stream never stopped."""
    measure = dict(cost='measure', warmup=0, repeats=1)
    adapt = inferencer('tent-stag', tiny_acdc, tiny_checkpoint,
                       tmp_path / 'a', stage_frames=None, realtime=measure)
    assert adapt.loop.realtime.cost is None
    assert adapt.realtime_record()['cost'] is None
    first = [adapt.step(adapt.load_frame(p))[1] for p in paths[:3]]
    record = adapt.realtime_record()
    assert record['how'] == 'measured' and record['cost'] > 0
    assert record['measured']['repeats'] == 1
    assert [s['adapted'] for s in first] == [
        adapt.loop.realtime.adapts(k) for k in range(3)]
    state = adapt.state_dict()
    assert state['realtime']['cost'] == record['cost']
    assert state['realtime']['adapted'] == adapt.adapted
    rest = [adapt.step(adapt.load_frame(p)) for p in paths[3:]]

    def measured_again(self, data_batch):
        raise AssertionError('the resumed stream measured again')

    monkeypatch.setattr(OnlineAdaptationLoop, 'measure_cost', measured_again)
    again = inferencer('tent-stag', tiny_acdc, tiny_checkpoint,
                       tmp_path / 'b', stage_frames=None, realtime=measure)
    again.load_state_dict(state)
    assert again.loop.realtime.cost == record['cost']
    assert again.loop.realtime.measured == record['measured']
    for (sample, stats), path in zip(rest, paths[3:]):
        got, got_stats = again.step(again.load_frame(path))
        assert np.array_equal(got.pred_sem_seg.data.numpy(),
                              sample.pred_sem_seg.data.numpy())
        assert got_stats == stats
    assert again.realtime_record() == adapt.realtime_record()
    assert same(weights(again), weights(adapt))
    # a state of the realistic run is of another run for one without
    plain = inferencer('tent-stag', tiny_acdc, tiny_checkpoint,
                       tmp_path / 'c', stage_frames=None)
    with pytest.raises(ValueError, match='test_cfg.realtime.cost'):
        plain.load_state_dict(state)
    for run in (adapt, again, plain):
        run.close()


def test_a_bad_cost_is_refused_before_any_frame(tiny_acdc, tiny_checkpoint,
                                                tmp_path):
    for bad in (0, -1, 'fast'):
        with pytest.raises(ValueError, match='test_cfg.realtime.cost must '
                           'be a number > 0'):
            inferencer('tent-stag', tiny_acdc, tiny_checkpoint, tmp_path,
                       realtime=bad)
