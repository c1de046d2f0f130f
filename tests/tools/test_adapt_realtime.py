"""``tools/adapt.py --realtime COST|measure``: the realistic online
protocol on a user's frames. The CSV's ``adapted`` column, the summary's
line (frames adapted, whether the forward keeps up with the input's frame
rate), a resume that keeps the measured cost and refuses another
``--realtime``, bad values refused by argparse."""
import csv
import json
import math

import pytest
from frame_helpers import benchmark_predictions, crash_at_frame
from test_adapt import adapt_tool, label_maps, run_adapt, stream_list
from test_adapt_run import tree

from mmseg_stag.apis.adapt_outputs import realtime_summary
from mmseg_stag.engine.online_loop import OnlineAdaptationLoop


@pytest.fixture
def paths(tiny_acdc, tiny_checkpoint, tmp_path):
    return [p for p, _ in benchmark_predictions(
        'tent-stag', tiny_acdc, tiny_checkpoint, tmp_path / 'test')]


def rows(out):
    with open(out / 'frames.csv') as f:
        return list(csv.DictReader(f))


def video_of(paths, path, fps=5):
    """The frames as a lossless video at ``fps``."""
    import cv2
    first = cv2.imread(paths[0])
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*'FFV1'),
                             fps, first.shape[1::-1])
    for p in paths:
        writer.write(cv2.imread(p))
    writer.release()
    return str(path)


def test_a_video_adapts_on_one_frame_in_three_and_says_if_it_keeps_up(
        paths, tiny_acdc, tiny_checkpoint, tmp_path, capfd):
    """Cost 2.5, a stage every 4 frames: frames 0 and 3 of each adapt; the
    CSV says which (the others have no loss), the summary how many and
    whether the forward is faster than the video's 5 frames/s."""
    video = video_of(paths, tmp_path / 'stream.avi')
    out = tmp_path / 'out'
    assert run_adapt('tent-stag', tiny_acdc, tiny_checkpoint, video, out,
                     '--realtime', '2.5', '--stage-frames', '4') == 0
    table = rows(out)
    assert list(table[0])[:6] == ['index', 'file', 'seconds', 'status',
                                  'reason', 'adapted']
    assert [r['adapted'] for r in table] == ['1', '0', '0', '1'] * 2
    assert [bool(r['loss']) for r in table] == [True, False, False,
                                                True] * 2
    assert len(label_maps(out)) == 8
    text = ''.join(capfd.readouterr())
    assert 'realtime: 4 of 8 frames adapted (cost 2.5, given); the ' \
        'forward ' in text
    assert 'the input gives a frame every 200 ms)' in text
    summary = json.loads((out / 'summary.json').read_text())
    entry = summary['realtime']
    assert entry['frames_adapted'] == 4 and entry['period'] == 3
    assert entry['forward_timed'] == 'frames predicted only'
    assert entry['input_fps'] == 5 and entry['forward_seconds'] > 0
    assert entry['forward_keeps_up'] == (entry['forward_seconds'] <= 0.2)
    # without --realtime, no such column
    assert run_adapt('tent-stag', tiny_acdc, tiny_checkpoint, video,
                     tmp_path / 'plain', '--limit', '2') == 0
    assert 'adapted' not in rows(tmp_path / 'plain')[0]
    assert 'realtime' not in json.loads(
        (tmp_path / 'plain' / 'summary.json').read_text())


def test_a_measured_run_resumes_with_its_cost_and_refuses_another(
        paths, tiny_acdc, tiny_checkpoint, tmp_path, monkeypatch, capfd):
    """``--realtime measure`` on a list (no frame rate), stopped at the
    sixth frame with the state saved every 2: ``--realtime 3`` refused,
    changing nothing; the resume measures nothing and keeps the schedule
    of the saved cost."""
    from mmseg_stag.apis import OnlineInferencer
    frames = stream_list(paths, tmp_path)
    out = tmp_path / 'cut'
    step = crash_at_frame(monkeypatch, 5)
    with pytest.raises(KeyboardInterrupt):
        run_adapt('tent-stag', tiny_acdc, tiny_checkpoint, frames, out,
                  '--realtime', 'measure', '--save-every', '2',
                  '--stage-frames', '8')
    monkeypatch.setattr(OnlineInferencer, 'step', step)
    assert 'realtime: measured' in ''.join(
        p.read_text() for p in out.rglob('*.log'))
    before = tree(out)
    with pytest.raises(SystemExit, match="realtime 3.0 \\(the run's: "
                       "'measure'\\)"):
        adapt_tool.main(['--resume', '--out-dir', str(out), '--realtime',
                         '3'])
    assert tree(out) == before

    def measured_again(self, data_batch):
        raise AssertionError('the resumed run measured again')

    monkeypatch.setattr(OnlineAdaptationLoop, 'measure_cost', measured_again)
    capfd.readouterr()
    assert adapt_tool.main(['--resume', '--out-dir', str(out)]) == 0
    entry = json.loads((out / 'summary.json').read_text())['realtime']
    period = max(1, math.ceil(entry['cost']))
    assert entry['period'] == period and entry['how'] == 'measured'
    want = [k % period == 0 for k in range(8)]
    assert [r['adapted'] for r in rows(out)] == [str(int(a)) for a in want]
    assert entry['frames_adapted'] == sum(want)
    assert entry['forward_timed'] == 'measured'
    assert entry['forward_seconds'] == entry['measured']['forward_seconds']
    assert entry['input_fps'] is None and entry['forward_keeps_up'] is None
    text = ''.join(capfd.readouterr())
    assert f'realtime: {sum(want)} of 8 frames adapted (cost ' \
        f'{entry["cost"]:.3g}, measured: step ' in text
    assert 'the input has no frame rate to compare the forward with' in text


@pytest.mark.parametrize('bad', ['0', '-1', 'fast', 'inf'])
def test_a_bad_cost_is_refused_by_argparse(bad, tmp_path, capsys):
    with pytest.raises(SystemExit) as err:
        adapt_tool.parse_args(['config.py', 'weights.pth', 'frames',
                               '--out-dir', str(tmp_path), '--realtime',
                               bad])
    assert err.value.code == 2
    assert 'a number > 0, or measure' in capsys.readouterr().err


def test_the_summary_says_whether_the_forward_keeps_up():
    record = dict(cost=2.9, how='measured', period=3, batches_adapted=34,
                  batches_predicted_only=66,
                  measured=dict(step_seconds=0.041, forward_seconds=0.014))
    entry, line = realtime_summary(record, None, 30.0)
    assert line == ('realtime: 34 of 100 frames adapted (cost 2.9, '
                    'measured: step 41 ms, forward 14 ms); the forward '
                    'keeps up with the input (14 ms a forward, the input '
                    'gives a frame every 33 ms)')
    assert entry['forward_keeps_up'] is True
    given = dict(record, cost=2.5, how='given', measured=None)
    entry, line = realtime_summary(given, 0.05, 30.0)
    assert line.endswith('(cost 2.5, given); the forward does not keep up '
                         'with the input (50 ms a forward, the input gives '
                         'a frame every 33 ms)')
    assert entry['forward_keeps_up'] is False
    assert entry['forward_timed'] == 'frames predicted only'
    _, line = realtime_summary(given, 0.05, None)
    assert line.endswith('; the input has no frame rate to compare the '
                         'forward with')
    _, line = realtime_summary(dict(given, batches_predicted_only=0), None,
                               30.0)
    assert line.endswith('; no frame was predicted only, no forward to '
                         'time')
