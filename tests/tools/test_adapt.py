"""``tools/adapt.py`` on the stand-in stream without labels: the label maps
it writes equal ``tools/test.py``'s predictions frame for frame; a video of
the frames (lossless) predicts as the frames; a run stopped mid-stream and
resumed writes what an uninterrupted one writes; bad frames and bad input
are named."""
import csv
import importlib.util
import os
import os.path as osp

import numpy as np
import pytest
import torch
from frame_helpers import benchmark_predictions, crash_at_frame, options
from PIL import Image
from seg_helpers import REPO, SEG_CFG, tiny_options


def load_tool(name):
    spec = importlib.util.spec_from_file_location(
        f'{name}_tool', osp.join(REPO, 'tools', f'{name}.py'))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


adapt_tool = load_tool('adapt')


def cli_options(opts):
    return ['--cfg-options'] + [f'{k}={v!r}' if isinstance(v, str) else
                                f'{k}={v}'.replace(' ', '')
                                for k, v in opts.items()]


def run_adapt(method, tiny_acdc, checkpoint, frames, out, *extra):
    args = [osp.join(REPO, SEG_CFG.format(method)), checkpoint, str(frames),
            '--out-dir', str(out), '--stage-frames', '2', *extra]
    return adapt_tool.main(args + cli_options(options(method, tiny_acdc)))


def label_maps(out):
    folder = osp.join(str(out), 'labels')
    return [np.array(Image.open(osp.join(folder, n)))
            for n in sorted(os.listdir(folder))]


def stream_list(paths, folder):
    path = osp.join(str(folder), 'frames.txt')
    with open(path, 'w') as f:
        f.write('# the stand-in stream, in its order\n' + '\n'.join(paths))
    return path


@pytest.mark.parametrize('method', ['tent-stag', 'cotta', 'bn-adapt-stag'])
def test_the_label_maps_are_the_benchmark_loops_predictions(
        method, tiny_acdc, tiny_checkpoint, tmp_path):
    want = benchmark_predictions(method, tiny_acdc, tiny_checkpoint,
                                 tmp_path / 'test')
    frames = stream_list([p for p, _ in want], tmp_path)
    assert run_adapt(method, tiny_acdc, tiny_checkpoint, frames,
                     tmp_path / 'out') == 0
    got = label_maps(tmp_path / 'out')
    assert len(got) == len(want) == 8
    for g, (path, labels) in zip(got, want):
        assert np.array_equal(g, labels[0]), path
    with open(tmp_path / 'out' / 'frames.csv') as f:
        rows = list(csv.DictReader(f))
    assert [r['file'] for r in rows] == [p for p, _ in want]
    assert {r['status'] for r in rows} == {'ok'}
    if method != 'cotta':
        assert all(float(r['loss']) == float(r['loss']) for r in rows)
    saved = torch.load(tmp_path / 'out' / 'checkpoints' /
                       'adapted_final.pth', weights_only=True)
    assert saved['meta']['frames'] == 8


def test_a_video_predicts_as_its_frames(tiny_acdc, tiny_checkpoint,
                                        tmp_path):
    """FFV1 (lossless): the same label maps as the frames as images; the
    CSV gives each frame's time in the video."""
    import cv2
    want = benchmark_predictions('tent-stag', tiny_acdc, tiny_checkpoint,
                                 tmp_path / 'test')
    paths = [p for p, _ in want]
    video = str(tmp_path / 'stream.avi')
    first = cv2.imread(paths[0])
    writer = cv2.VideoWriter(video, cv2.VideoWriter_fourcc(*'FFV1'), 5,
                             first.shape[1::-1])
    for p in paths:
        writer.write(cv2.imread(p))
    writer.release()
    run_adapt('tent-stag', tiny_acdc, tiny_checkpoint, video,
              tmp_path / 'video', '--overlay', '--video')
    for got, (_, labels) in zip(label_maps(tmp_path / 'video'), want):
        assert np.array_equal(got, labels[0])
    with open(tmp_path / 'video' / 'frames.csv') as f:
        rows = list(csv.DictReader(f))
    assert [float(r['seconds']) for r in rows] == [i / 5 for i in range(8)]
    assert len(os.listdir(tmp_path / 'video' / 'overlays')) == 8
    assert cv2.VideoCapture(str(tmp_path / 'video' /
                                'prediction.mp4')).read()[0]
    # the frames beside their labels: the video's frames decoded (before,
    # tools/adapt_compare.py looked for a file named stream.avi#0)
    compare = load_tool('adapt_compare')
    figure = tmp_path / 'compare.png'
    assert compare.main([str(tmp_path / 'video'), '--frames', '0', '3',
                         '--out', str(figure)]) == 0
    assert figure.stat().st_size > 0
    frame = np.asarray(compare.frame_image(f'{video}#3'))
    assert np.array_equal(frame, cv2.imread(paths[3])[..., ::-1])


def test_a_stopped_run_resumed_writes_what_an_uninterrupted_one_does(
        tiny_acdc, tiny_checkpoint, tmp_path, monkeypatch):
    """Stopped at the sixth frame (a crash), state saved every 2 frames:
    ``--resume`` goes on from frame 4 and every file written equals the
    uninterrupted run's (CoTTA: its random restores too)."""
    from mmseg_stag.apis import OnlineInferencer
    want = benchmark_predictions('cotta', tiny_acdc, tiny_checkpoint,
                                 tmp_path / 'test')
    frames = stream_list([p for p, _ in want], tmp_path)
    run_adapt('cotta', tiny_acdc, tiny_checkpoint, frames, tmp_path / 'whole',
              '--save-every', '2')
    step = crash_at_frame(monkeypatch, 5)
    with pytest.raises(KeyboardInterrupt):
        run_adapt('cotta', tiny_acdc, tiny_checkpoint, frames,
                  tmp_path / 'cut', '--save-every', '2')
    monkeypatch.setattr(OnlineInferencer, 'step', step)
    assert len(label_maps(tmp_path / 'cut')) == 5
    with pytest.raises(SystemExit, match='holds a run'):
        run_adapt('cotta', tiny_acdc, tiny_checkpoint, frames,
                  tmp_path / 'cut')
    run_adapt('cotta', tiny_acdc, tiny_checkpoint, frames, tmp_path / 'cut',
              '--save-every', '2', '--resume')
    for a, b in zip(label_maps(tmp_path / 'whole'),
                    label_maps(tmp_path / 'cut')):
        assert np.array_equal(a, b)
    for name in ('frames.csv', ):
        assert (tmp_path / 'whole' / name).read_text() == \
            (tmp_path / 'cut' / name).read_text()
    whole, cut = (torch.load(tmp_path / d / 'checkpoints' /
                             'adapted_final.pth', weights_only=True)
                  for d in ('whole', 'cut'))
    for key, value in whole['state_dict'].items():
        assert torch.equal(value, cut['state_dict'][key]), key


def test_a_truncated_frame_is_skipped_and_named_or_stops_the_run(
        tiny_acdc, tiny_checkpoint, tmp_path):
    want = benchmark_predictions('tent-stag', tiny_acdc, tiny_checkpoint,
                                 tmp_path / 'test')
    paths = [p for p, _ in want]
    broken = str(tmp_path / 'broken.png')
    with open(paths[2], 'rb') as f:
        head = f.read(60)  # a PNG cut short, as a crash while copying
    with open(broken, 'wb') as f:
        f.write(head)
    frames = stream_list(paths[:2] + [broken] + paths[2:4], tmp_path)
    run_adapt('tent-stag', tiny_acdc, tiny_checkpoint, frames,
              tmp_path / 'skip', '--reset-every', '3')
    with open(tmp_path / 'skip' / 'frames.csv') as f:
        rows = list(csv.DictReader(f))
    assert [r['status'] for r in rows] == ['ok', 'ok', 'skipped', 'ok',
                                          'ok']
    assert rows[2]['file'] == broken and rows[2]['reason']
    # the reset every 3 stepped frames, after the fourth row's frame
    assert [bool(r['reset']) for r in rows] == [False] * 3 + [True, False]
    assert len(label_maps(tmp_path / 'skip')) == 4
    log = ''.join(p.read_text() for p in (tmp_path / 'skip').rglob('*.log'))
    assert 'frame 2 (' + broken + ') skipped' in log
    with pytest.raises(SystemExit, match=r'frame 2 \(.*broken.png\) cannot '
                       'be read'):
        run_adapt('tent-stag', tiny_acdc, tiny_checkpoint, frames,
                  tmp_path / 'stop', '--on-bad-frame', 'stop')


@pytest.mark.parametrize('case,message', [
    ('empty', 'no image in this folder'),
    ('codec', 'not a video container OpenCV can open'),
    ('method', 'has no online method'),
    ('classes', r'\(19 vs 7 classes'),
])
def test_bad_input_is_one_sentence_before_any_work(
        case, message, tiny_acdc, tiny_checkpoint, tmp_path):
    config = osp.join(REPO, SEG_CFG.format('tent'))
    frames = tmp_path / 'frames'
    frames.mkdir()
    opts = tiny_options(tiny_acdc, rounds=1)
    if case == 'empty':
        (frames / 'notes.txt').write_text('no images here')
    else:
        frames = osp.join(tiny_acdc, 'rgb_anon', 'fog')
    if case == 'codec':
        frames = str(tmp_path / 'clip.mp4')
        with open(frames, 'wb') as f:
            f.write(b'not a video at all' * 100)
    if case == 'method':
        config = osp.join(REPO, 'configs/_base_/datasets/acdc_continual.py')
    if case == 'classes':
        opts['model.decode_head.num_classes'] = 7
    out = tmp_path / 'out'
    with pytest.raises(SystemExit, match=message):
        adapt_tool.main([config, tiny_checkpoint, str(frames), '--out-dir',
                         str(out)] + cli_options(opts))
    assert not (out / 'labels').exists()
