"""Adapt a segmentor online on your own footage (no labels) and write its
predictions::

    python tools/adapt.py CONFIG CHECKPOINT INPUT --out-dir DIR
        [--overlay] [--video] [--fps F] [--opacity A]
        [--reset-every N] [--stage-frames N] [--on-nonfinite stop|reset]
        [--on-bad-frame skip|stop] [--save-every N] [--checkpoint-every N]
        [--resume] [--workers N] [--limit N] [--cfg-options k=v ...]
        [--trust-pickle]

INPUT is an image folder (every image under it, sorted by path), a text
file listing images (in its order) or a video file. Each frame is
predicted, then adapted on, by the config's method
(``mmseg_stag.apis.OnlineInferencer``: the step of ``tools/test.py``'s
loop). DIR gets:

- ``labels/<index>_<name>.png``: each frame's label map (palette PNG, the
  config's classes and colours); ``overlays/`` with ``--overlay``;
- ``frames.csv``: per frame its index, file, time in the video, status
  (``ok`` or ``skipped`` and why), the method's statistics (``loss``,
  ``loss_stag``, ``beta``, …) and the restarts from the source;
- ``checkpoints/adapted_final.pth`` (and every ``--checkpoint-every``
  frames): the adapted weights, a checkpoint ``tools/test.py`` reads;
- ``adapt_state.pth`` every ``--save-every`` frames: ``--resume``
  continues from it with the result of an uninterrupted run;
- ``prediction.mp4`` with ``--video`` (the overlays, or the label colours,
  at the input's frame rate), ``summary.json``, and the run's log.

docs/adapt.md says more.
"""
import argparse
import csv
import os
import os.path as osp
import queue
import sys
import threading
import time

import numpy as np

REPO = osp.dirname(osp.dirname(osp.abspath(__file__)))
if REPO not in sys.path:  # the package, not installed in a checkout
    sys.path.insert(0, REPO)

STATE_FILE = 'adapt_state.pth'
CSV_FILE = 'frames.csv'
#: the CSV's first columns; the method's statistics follow
COLUMNS = ['index', 'file', 'seconds', 'status', 'reason']


def parse_args(argv=None):
    from mmengine.config import DictAction
    parser = argparse.ArgumentParser(
        description='adapt a segmentor online on an image folder, a list of '
        'images or a video, without labels, and write its predictions')
    add = parser.add_argument
    add('config', help='a config of the online loop (configs/stag_acdc)')
    add('checkpoint', help='the source weights')
    add('input', help='an image folder, a .txt list of images, or a video')
    add('--out-dir', required=True, help='where the predictions go')
    add('--overlay', action='store_true', help='also write each frame with '
        'its label colours blended in (overlays/)')
    add('--opacity', type=float, default=0.5, help='the overlay\'s label '
        'opacity (default %(default)s)')
    add('--video', action='store_true', help='also write prediction.mp4: '
        'the overlays (or the label colours) at the input\'s frame rate')
    add('--fps', type=float, help='the output video\'s rate for image '
        'input (default 10), or to replace a video\'s')
    add('--reset-every', type=int, metavar='N', help='restart from the '
        'source weights after every N frames (default: never)')
    add('--stage-frames', type=int, metavar='N', help='a new stage every N '
        'frames: what the config restarts per stage (STAG\'s beta_t in the '
        '+STAG configs) restarts (default: one stage; ACDC\'s are 400)')
    add('--on-nonfinite', choices=('stop', 'reset'), default='stop',
        help='a non-finite loss: stop, as tools/test.py, or restart from '
        'the source weights and go on (default %(default)s)')
    add('--on-bad-frame', choices=('skip', 'stop'), default='skip',
        help='an unreadable frame: skip it (named in the log and the CSV) '
        'or stop (default %(default)s)')
    add('--save-every', type=int, default=100, metavar='N', help='write '
        'the state --resume continues from every N frames (default '
        '%(default)s; 0: only at the end)')
    add('--checkpoint-every', type=int, default=0, metavar='N',
        help='also save the adapted weights every N frames (default: at the '
        'end only)')
    add('--resume', action='store_true', help='continue the run in '
        '--out-dir from its last saved state')
    add('--workers', type=int, help='processes decoding image files '
        '(default: the config\'s loader workers)')
    add('--limit', type=int, metavar='N', help='the first N frames only')
    add('--trust-pickle', action='store_true', help='allow a legacy '
        'pickle checkpoint (trusted files only)')
    add('--cfg-options', nargs='+', action=DictAction, help='override '
        'config settings, as tools/test.py')
    args = parser.parse_args(argv)
    for key in ('reset_every', 'stage_frames', 'limit'):
        value = getattr(args, key)
        if value is not None and value < 1:
            parser.error(f'--{key.replace("_", "-")} must be >= 1')
    for key in ('save_every', 'checkpoint_every'):
        if getattr(args, key) < 0:
            parser.error(f'--{key.replace("_", "-")} must be >= 0')
    if not 0 <= args.opacity <= 1:
        parser.error('--opacity must be in [0, 1]')
    if args.fps is not None and args.fps <= 0:
        parser.error('--fps must be > 0')
    return args


# ------------------------------------------------------------- the frames
def passthrough(item):
    return item


class FrameFiles:
    """Image files through the pipeline in loader workers; a frame that
    fails (unreadable, truncated) comes back with why instead of data."""

    def __init__(self, source, pipeline, start, stop):
        self.source, self.pipeline = source, pipeline
        self.start, self.stop = start, stop

    def __len__(self):
        return self.stop - self.start

    def __getitem__(self, i):
        from mmseg_stag.segmentation.datasets.frame_stream import frame_info
        index = self.start + i
        path = self.source.files[index]
        try:
            data = self.pipeline(frame_info(index, path))
        except Exception as err:  # the reason goes to the log and the CSV
            return index, None, None, f'{type(err).__name__}: {err}'
        if data is None:
            return index, None, None, 'the pipeline dropped it'
        return index, data, None, None


def file_frames(source, inferencer, start, stop, workers):
    """``(index, data, image, why)`` of image files from ``start``: decoded
    in ``workers`` processes (their own random generator: the global one
    stays the benchmark loop's)."""
    import torch
    from torch.utils.data import DataLoader
    dataset = FrameFiles(source, inferencer.pipeline(False), start, stop)
    loader = DataLoader(dataset, batch_size=None, shuffle=False,
                        num_workers=workers, collate_fn=passthrough,
                        generator=torch.Generator())
    yield from loader


def video_frames(source, inferencer, start, stop):
    """``(index, data, image, why)`` of a video from ``start``, decoded
    and through the pipeline in a thread ahead of the steps."""
    pipeline = inferencer.pipeline(True)
    from mmseg_stag.segmentation.datasets.frame_stream import frame_info
    ahead: queue.Queue = queue.Queue(maxsize=8)
    done = object()

    def decode():
        try:
            for index, image in source.video_frames(start):
                if index >= stop:
                    break
                try:
                    data = pipeline(frame_info(index, image=image))
                    ahead.put((index, data, image, None))
                except Exception as err:
                    ahead.put((index, None, image,
                               f'{type(err).__name__}: {err}'))
        finally:
            ahead.put(done)

    thread = threading.Thread(target=decode, daemon=True)
    thread.start()
    while True:
        item = ahead.get()
        if item is done:
            break
        yield item
    thread.join()


# ------------------------------------------------------------ the outputs
class Writer:
    """Each frame's label map (palette PNG) and overlay, written as
    ``<index>_<name>`` so that a folder sorts as the stream."""

    def __init__(self, out_dir, palette, overlay, opacity):
        self.labels = osp.join(out_dir, 'labels')
        self.overlays = osp.join(out_dir, 'overlays') if overlay else None
        for folder in (self.labels, self.overlays):
            if folder:
                os.makedirs(folder, exist_ok=True)
        colours = np.zeros((256, 3), np.uint8)
        colours[:len(palette)] = np.asarray(palette, np.uint8)
        self.colours, self.opacity = colours, opacity

    @staticmethod
    def stem(index, name):
        base = osp.splitext(osp.basename(name.split('#')[0]))[0]
        return f'{index:06d}_{base}'

    def write(self, index, name, labels, image_of):
        from PIL import Image
        stem = self.stem(index, name)
        png = Image.fromarray(labels, mode='P')
        png.putpalette(self.colours.reshape(-1).tolist())
        save_atomic_image(png, osp.join(self.labels, stem + '.png'))
        if self.overlays:
            import cv2
            image = image_of()
            colour = self.colours[labels][..., ::-1]  # RGB -> BGR
            blend = cv2.addWeighted(image, 1 - self.opacity, colour,
                                    self.opacity, 0)
            cv2.imwrite(osp.join(self.overlays, stem + '.jpg'), blend)


def save_atomic_image(image, path):
    """A PIL image written whole or not at all (a crash leaves no half
    file)."""
    tmp = path + '.tmp'
    image.save(tmp, format='PNG')
    os.replace(tmp, path)


def write_video(out_dir, frames_dir, suffix, fps):
    """The frames of ``frames_dir`` (in order) as ``prediction.mp4``."""
    import cv2
    names = sorted(n for n in os.listdir(frames_dir) if n.endswith(suffix))
    if not names:
        return None
    first = cv2.imread(osp.join(frames_dir, names[0]), cv2.IMREAD_COLOR)
    height, width = first.shape[:2]
    path = osp.join(out_dir, 'prediction.mp4')
    video = cv2.VideoWriter(path, cv2.VideoWriter_fourcc(*'mp4v'), fps,
                            (width, height))
    if not video.isOpened():
        raise RuntimeError(f'OpenCV cannot write {path} (mp4v)')
    for name in names:
        video.write(cv2.imread(osp.join(frames_dir, name), cv2.IMREAD_COLOR))
    video.release()
    return path


class FrameTable:
    """``frames.csv``, a row a frame, flushed at once; on a resume the
    rows from the resumed frame on are dropped first."""

    def __init__(self, path, resume_at=None):
        self.path, self.columns, self.file = path, None, None
        if resume_at is not None and osp.isfile(path):
            with open(path, newline='') as f:
                reader = csv.DictReader(f)
                self.columns = reader.fieldnames
                rows = [r for r in reader if int(r['index']) < resume_at]
            self.open()
            for row in rows:
                self.writer.writerow(row)
            self.file.flush()

    def open(self):
        self.file = open(self.path, 'w', newline='')
        self.writer = csv.DictWriter(self.file, self.columns,
                                     extrasaction='ignore')
        self.writer.writeheader()

    def add(self, row, stats):
        if self.columns is None:  # the method's statistics, as it logs them
            self.columns = COLUMNS + sorted(
                k for k in stats if k not in ('reset', 'nonfinite')) + [
                    'reset']
            self.open()
        self.writer.writerow({**row, **stats})
        self.file.flush()

    def close(self):
        if self.file:
            self.file.close()


# ---------------------------------------------------------------- the run
def check_out_dir(args):
    """A fresh run needs an out dir without a run; ``--resume`` one with."""
    state = osp.join(args.out_dir, STATE_FILE)
    if args.resume and not osp.isfile(state):
        raise SystemExit(f'error: --resume: no run to continue in '
                         f'{args.out_dir} (no {STATE_FILE}); run without '
                         '--resume to start it')
    if not args.resume and osp.isfile(state):
        raise SystemExit(f'error: {args.out_dir} holds a run ({STATE_FILE}):'
                         ' --resume continues it, or give another --out-dir')


def save_state(path, inferencer, source, next_frame, skipped):
    from mmseg_stag.engine.run_state import save_run_state
    save_run_state(path, dict(inferencer=inferencer.state_dict(),
                     input=dict(path=osp.abspath(source.path),
                                kind=source.kind, count=source.count),
                     next_frame=int(next_frame), skipped=list(skipped)))


def load_state(path, inferencer, source):
    """The saved state into ``inferencer``; the next frame and the skipped
    ones so far (``SystemExit`` for another input or run)."""
    from mmseg_stag.engine.run_state import load_run_state
    try:
        state = load_run_state(path)
    except RuntimeError as err:  # corrupt, truncated, another version
        raise SystemExit(f'error: --resume: {err}') from None
    saved = state['input']
    now = dict(path=osp.abspath(source.path), kind=source.kind,
               count=source.count)
    if saved != now:
        raise SystemExit(f'error: --resume: {path} adapted on {saved}, this '
                         f'input is {now}')
    try:
        inferencer.load_state_dict(state['inferencer'])
    except ValueError as err:
        raise SystemExit(f'error: --resume: {err}') from None
    return state['next_frame'], state['skipped']


def main(argv=None) -> int:
    args = parse_args(argv)
    from mmseg_stag.apis import OnlineInferencer, open_frames
    try:
        source = open_frames(args.input)
    except (OSError, ValueError) as err:
        raise SystemExit(f'error: {err}') from None
    check_out_dir(args)
    os.makedirs(args.out_dir, exist_ok=True)
    try:
        inferencer = OnlineInferencer(
            args.config, args.checkpoint, work_dir=args.out_dir,
            cfg_options=args.cfg_options, reset_every=args.reset_every,
            stage_frames=args.stage_frames, on_nonfinite=args.on_nonfinite,
            trust_pickle=args.trust_pickle)
    except (OSError, ValueError) as err:
        raise SystemExit(f'error: {err}') from None
    from mmengine.logging import print_log
    from mmengine.utils import ProgressBar
    state_path = osp.join(args.out_dir, STATE_FILE)
    start, skipped = 0, []
    if args.resume:
        start, skipped = load_state(state_path, inferencer, source)
    stop = min(source.count or sys.maxsize, args.limit or sys.maxsize)
    print_log(f'adapting on {source.path} ({source.kind}, {source.count} '
              f'frames, {source.order}) from frame {start}; predictions to '
              f'{args.out_dir}', logger='current')
    writer = Writer(args.out_dir, inferencer.palette, args.overlay,
                    args.opacity)
    table = FrameTable(osp.join(args.out_dir, CSV_FILE),
                       resume_at=start if args.resume else None)
    workers = inferencer.workers if args.workers is None else args.workers
    frames = video_frames(source, inferencer, start, stop) \
        if source.kind == 'video' else file_frames(
            source, inferencer, start, stop, workers)
    progress = ProgressBar(max(stop - start, 0) if stop < sys.maxsize
                           else 0, file=sys.stdout)
    started, stepped, next_frame = time.perf_counter(), 0, start
    try:
        for index, data, image, why in frames:
            name = source.name(index)
            row = dict(index=index, file=name,
                       seconds=source.seconds(index))
            if data is None:
                skipped.append(dict(index=index, file=name, why=why))
                print_log(f'frame {index} ({name}) skipped: {why}',
                          logger='current', level=30)
                if args.on_bad_frame == 'stop':
                    raise SystemExit(f'error: frame {index} ({name}) cannot '
                                     f'be read: {why} (--on-bad-frame skip '
                                     'goes on without it)')
                table.add(dict(row, status='skipped', reason=why), {})
            else:
                sample, stats = inferencer.step(data, name)
                labels = sample.pred_sem_seg.data[0].cpu().numpy().astype(
                    np.uint8)
                writer.write(index, name, labels, lambda: image if image
                             is not None else read_image(name))
                table.add(dict(row, status='ok',
                               reason=stats.pop('nonfinite', None)), stats)
                stepped += 1
                every = args.checkpoint_every
                if every and (index + 1) % every == 0:
                    inferencer.save_checkpoint(osp.join(
                        args.out_dir, 'checkpoints',
                        f'adapted_{index + 1:06d}.pth'))
            next_frame = index + 1
            if args.save_every and next_frame % args.save_every == 0:
                save_state(state_path, inferencer, source, next_frame,
                           skipped)
            progress.update()
    finally:
        table.close()
    sys.stdout.write('\n')
    seconds = time.perf_counter() - started
    save_state(state_path, inferencer, source, next_frame, skipped)
    final = osp.join(args.out_dir, 'checkpoints', 'adapted_final.pth')
    inferencer.save_checkpoint(final)
    video = None
    if args.video:
        fps = args.fps or source.fps or 10.0
        video = write_video(args.out_dir, writer.overlays, '.jpg', fps) \
            if writer.overlays else write_video(args.out_dir, writer.labels,
                                                '.png', fps)
    summary = dict(input=source.path, kind=source.kind, order=source.order,
                   frames=next_frame, stepped_this_run=stepped,
                   skipped=skipped, resets=inferencer.resets,
                   seconds_this_run=round(seconds, 3),
                   frames_per_second=round(stepped / seconds, 3)
                   if seconds > 0 else None,
                   checkpoint=final, video=video, config=args.config,
                   source_checkpoint=args.checkpoint)
    from mmseg_stag.engine.report import write_json
    write_json(osp.join(args.out_dir, 'summary.json'), summary)
    print_log(f'adapted on {next_frame} frames ({len(skipped)} skipped, '
              f'{len(inferencer.resets)} restarts from the source); '
              f'{stepped} this run in {seconds:.1f} s '
              f'({summary["frames_per_second"]} frames/s); '
              f'{args.out_dir}/{CSV_FILE}, labels/, {final}',
              logger='current')
    inferencer.close()
    return 0


def read_image(path):
    import cv2
    return cv2.imread(path, cv2.IMREAD_COLOR)


if __name__ == '__main__':
    sys.exit(main())
