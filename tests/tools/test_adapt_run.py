"""What a user touches after ``tools/adapt.py`` ran: a video of one frame
per frame whatever their sizes, a run on nothing failing, a refused resume
changing nothing, Ctrl-C saving the state and a resume from the out dir
alone equal to an uninterrupted run, ``--labels-at test``, ``--show``,
``--device``, ``--threads``, a quiet console with a true ETA."""
import csv
import hashlib
import io
import os
import os.path as osp
import signal

import numpy as np
import pytest
import torch
from frame_helpers import benchmark_predictions
from test_adapt import adapt_tool, label_maps, run_adapt, stream_list

from mmseg_stag.apis.adapt_outputs import FrameTable, Progress


def tree(folder):
    """Every file under ``folder``: its bytes' digest and its mtime."""
    out = {}
    for root, _, names in os.walk(folder):
        for name in names:
            path = osp.join(root, name)
            with open(path, 'rb') as f:
                out[osp.relpath(path, folder)] = (
                    hashlib.sha1(f.read()).hexdigest(),
                    os.stat(path).st_mtime_ns)
    return out


@pytest.fixture
def paths(tiny_acdc, tiny_checkpoint, tmp_path):
    return [p for p, _ in benchmark_predictions(
        'tent-stag', tiny_acdc, tiny_checkpoint, tmp_path / 'test')]


def test_the_video_has_a_frame_per_frame_whatever_their_sizes(
        paths, tiny_acdc, tiny_checkpoint, tmp_path):
    """Before, OpenCV's writer dropped every frame of another size than
    the first (with a warning only)."""
    import cv2
    frames = []
    for i, path in enumerate(paths[:5]):
        image = cv2.imread(path)
        if i % 2:  # another size and aspect every other frame
            image = cv2.resize(image, (60 + 10 * i, 50))
        frames.append(str(tmp_path / f'f{i}.png'))
        cv2.imwrite(frames[-1], image)
    for overlay in ((), ('--overlay', )):
        out = tmp_path / f'video{len(overlay)}'
        assert run_adapt('tent-stag', tiny_acdc, tiny_checkpoint,
                         stream_list(frames, tmp_path), out, '--video',
                         *overlay) == 0
        video = cv2.VideoCapture(str(out / 'prediction.mp4'))
        count = 0
        while video.read()[0]:
            count += 1
        assert count == 5
        shapes = [m.shape for m in label_maps(out)]
        assert shapes[0] == (48, 96) and shapes[1] == (50, 70)


def test_a_run_on_nothing_fails_and_writes_no_checkpoint(
        tiny_acdc, tiny_checkpoint, tmp_path):
    frames = tmp_path / 'frames'
    frames.mkdir()
    for i in range(3):
        (frames / f'{i}.png').write_bytes(b'not a png')
    out = tmp_path / 'out'
    with pytest.raises(SystemExit, match=r'nothing adapted on: .*\(3 skipped'):
        run_adapt('tent-stag', tiny_acdc, tiny_checkpoint, frames, out)
    assert not (out / 'checkpoints').exists()
    assert not (out / adapt_tool.RUN_FILE).exists()


def test_a_refused_resume_changes_nothing(paths, tiny_acdc, tiny_checkpoint,
                                          tmp_path):
    """Another option, or other starting weights under the same name:
    refused before anything is built; every file as it was (before, the
    config copy was overwritten first)."""
    frames = stream_list(paths[:4], tmp_path)
    out = tmp_path / 'out'
    run_adapt('tent-stag', tiny_acdc, tiny_checkpoint, frames, out,
              '--save-every', '2', '--limit', '2')
    before = tree(out)
    with pytest.raises(SystemExit, match='stage-frames 3'):
        adapt_tool.main(['--resume', '--out-dir', str(out),
                         '--stage-frames', '3'])
    assert tree(out) == before
    moved = tmp_path / 'other.pth'
    ckpt = torch.load(tiny_checkpoint, weights_only=True)
    ckpt['state_dict']['decode_head.conv_seg.bias'] += 1
    torch.save(ckpt, moved)
    record = out / adapt_tool.RUN_FILE
    text = record.read_text()
    record.write_text(text.replace(osp.abspath(tiny_checkpoint),
                                   str(moved)))
    with pytest.raises(SystemExit, match=r'(?s)another run.*starting weights'):
        adapt_tool.main(['--resume', '--out-dir', str(out)])
    stat = os.stat(record)
    record.write_text(text)
    os.utime(record, ns=(stat.st_atime_ns, before[adapt_tool.RUN_FILE][1]))
    assert tree(out) == before


def test_ctrl_c_saves_the_state_and_the_out_dir_alone_resumes(
        paths, tiny_acdc, tiny_checkpoint, tmp_path, monkeypatch):
    """SIGINT at the third frame, no --save-every boundary reached: the
    run ends that frame, saves, exits 130; ``--resume --out-dir`` goes on
    with the run's own options to the uninterrupted run's files."""
    from mmseg_stag.apis import OnlineInferencer
    frames = stream_list(paths, tmp_path)
    run_adapt('tent-stag', tiny_acdc, tiny_checkpoint, frames,
              tmp_path / 'whole')
    step = OnlineInferencer.step

    def interrupted(self, data, name=None):
        if self.frames == 2:
            signal.raise_signal(signal.SIGINT)
        return step(self, data, name)

    monkeypatch.setattr(OnlineInferencer, 'step', interrupted)
    assert run_adapt('tent-stag', tiny_acdc, tiny_checkpoint, frames,
                     tmp_path / 'cut') == 130
    monkeypatch.setattr(OnlineInferencer, 'step', step)
    assert len(label_maps(tmp_path / 'cut')) == 3
    assert adapt_tool.main(['--resume', '--out-dir',
                            str(tmp_path / 'cut')]) == 0
    for a, b in zip(label_maps(tmp_path / 'whole'),
                    label_maps(tmp_path / 'cut')):
        assert np.array_equal(a, b)
    assert (tmp_path / 'whole' / 'frames.csv').read_text() == \
        (tmp_path / 'cut' / 'frames.csv').read_text()
    whole, cut = (torch.load(tmp_path / d / 'checkpoints' /
                             'adapted_final.pth', weights_only=True)
                  for d in ('whole', 'cut'))
    for key, value in whole['state_dict'].items():
        assert torch.equal(value, cut['state_dict'][key]), key
    with pytest.raises(SystemExit, match='is done: 8 frames'):
        adapt_tool.main(['--resume', '--out-dir', str(tmp_path / 'cut')])


def test_labels_at_the_test_scale_are_the_frames_size(
        paths, tiny_acdc, tiny_checkpoint, tmp_path):
    """BN Adapt+STAG predicts at 64x32, the labels resized to the 96x48
    frames; TENT (its full-size pseudo-label loss) and CoTTA adapt on
    full-size predictions: refused."""
    frames = stream_list(paths[:3], tmp_path)
    run_adapt('bn-adapt-stag', tiny_acdc, tiny_checkpoint, frames,
              tmp_path / 'frame')
    run_adapt('bn-adapt-stag', tiny_acdc, tiny_checkpoint, frames,
              tmp_path / 'test', '--labels-at', 'test')
    full, coarse = label_maps(tmp_path / 'frame'), label_maps(
        tmp_path / 'test')
    assert [m.shape for m in coarse] == [m.shape for m in full]
    agree = np.mean([np.mean(a == b) for a, b in zip(full, coarse)])
    assert 0.5 < agree < 1
    for method, name in (('cotta', 'CoTTA'), ('tent-stag', 'TENT')):
        with pytest.raises(SystemExit, match=f'{name} adapts on its '
                           "predictions at the frame's own size"):
            run_adapt(method, tiny_acdc, tiny_checkpoint, frames,
                      tmp_path / method, '--labels-at', 'test')


def test_show_opens_a_window_per_frame_and_q_stops(
        paths, tiny_acdc, tiny_checkpoint, tmp_path, monkeypatch):
    import cv2
    frames = stream_list(paths[:5], tmp_path)
    monkeypatch.delenv('DISPLAY', raising=False)
    monkeypatch.delenv('WAYLAND_DISPLAY', raising=False)
    with pytest.raises(SystemExit, match='--show needs a display'):
        run_adapt('tent-stag', tiny_acdc, tiny_checkpoint, frames,
                  tmp_path / 'none', '--show')
    assert not (tmp_path / 'none').exists()
    monkeypatch.setenv('DISPLAY', ':99')
    shown = []
    monkeypatch.setattr(cv2, 'imshow', lambda t, p: shown.append(p.shape))
    monkeypatch.setattr(cv2, 'waitKey',
                        lambda ms: ord('q') if len(shown) == 2 else -1)
    monkeypatch.setattr(cv2, 'destroyWindow', lambda t: None)
    assert run_adapt('tent-stag', tiny_acdc, tiny_checkpoint, frames,
                     tmp_path / 'show', '--show') == 130
    assert shown == [(48, 96, 3)] * 2
    assert len(label_maps(tmp_path / 'show')) == 2


def test_device_and_threads(paths, tiny_acdc, tiny_checkpoint, tmp_path):
    frames = stream_list(paths[:2], tmp_path)
    if not torch.cuda.is_available():
        with pytest.raises(SystemExit, match="device 'cuda': this torch "
                           'sees no CUDA GPU'):
            run_adapt('tent-stag', tiny_acdc, tiny_checkpoint, frames,
                      tmp_path / 'cuda', '--device', 'cuda')
    threads = torch.get_num_threads()
    try:
        assert run_adapt('tent-stag', tiny_acdc, tiny_checkpoint, frames,
                         tmp_path / 'cpu', '--device', 'cpu', '--threads',
                         '1') == 0
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(threads)
    log = ''.join(p.read_text() for p in (tmp_path / 'cpu').rglob('*.log'))
    assert 'on cpu (1 threads, 0 decoding workers)' in log


def test_the_console_shows_the_run_not_the_config(
        paths, tiny_acdc, tiny_checkpoint, tmp_path, capfd):
    frames = stream_list(paths[:3], tmp_path)
    run_adapt('tent-stag', tiny_acdc, tiny_checkpoint, frames,
              tmp_path / 'out')
    console = capfd.readouterr()
    text = console.out + console.err
    assert 'System environment' not in text and 'Config:' not in text
    assert 'adapting on' in text and '3/3 frames' in text
    assert len(text.splitlines()) < 20, text
    log = ''.join(p.read_text() for p in (tmp_path / 'out').rglob('*.log'))
    assert 'System environment' in log and 'Config:' in log


def test_the_eta_is_the_recent_rate_of_what_is_left():
    # the first frame done 10 s in (its step built the optimizer)
    now = iter([10.0, 11.0, 12.0, 13.0, 14.0]).__next__
    out = io.StringIO()
    progress = Progress(total=10, file=out, every=0, now=now)
    for _ in range(5):
        progress.update()
    # the first frame's 10 s left out: 1 frame/s, 5 frames left
    assert out.getvalue().splitlines()[-1] == \
        '5/10 frames, 1.00 frames/s, ETA 0:00:05'
    assert 'ETA' not in out.getvalue().splitlines()[0]
    live = io.StringIO()
    stream = Progress(total=None, file=live, every=0,
                      now=iter([0.0, 1.0, 1.5]).__next__)
    for _ in range(3):
        stream.update()
    assert live.getvalue().splitlines()[-1] == '3 frames, 1.33 frames/s'


def test_a_reason_with_a_newline_stays_one_csv_row(tmp_path):
    table = FrameTable(str(tmp_path / 'frames.csv'))
    table.add(dict(index=0, file='a.png', seconds=None, status='skipped',
                   reason='OpenCV:\nerror (-215)\n  at line 3'), {})
    table.close()
    text = (tmp_path / 'frames.csv').read_text()
    assert len(text.splitlines()) == 2  # a line a row, for any reader
    rows = list(csv.reader(io.StringIO(text)))
    assert rows[1][4] == 'OpenCV: error (-215) at line 3'


def test_a_stream_is_adapted_on_live(serve, tiny_acdc, tiny_checkpoint,
                                     tmp_path):
    """An MJPEG stream the test serves (as an IP camera): the frames taken
    numbered on, those that came while a step ran counted as dropped."""
    import json
    url, _ = serve(frames=600, fps=60, size=(96, 48))
    out = tmp_path / 'live'
    assert run_adapt('tent-stag', tiny_acdc, tiny_checkpoint, url, out,
                     '--limit', '6') == 0
    assert [m.shape for m in label_maps(out)] == [(48, 96)] * 6
    with open(out / 'frames.csv') as f:
        rows = list(csv.DictReader(f))
    assert [int(r['index']) for r in rows] == list(range(6))
    assert rows[0]['file'] == f'{url}#0' and float(rows[0]['seconds']) == 0
    summary = json.loads((out / 'summary.json').read_text())
    assert summary['kind'] == 'stream' and summary['frames'] == 6
    assert summary['dropped'] >= 0
