"""Adapt a segmentor online on your own footage (no labels) and write its
predictions::

    python tools/adapt.py CONFIG CHECKPOINT INPUT --out-dir DIR
        [--overlay] [--video] [--fps F] [--opacity A] [--show]
        [--reset-every N] [--stage-frames N] [--on-nonfinite stop|reset]
        [--on-bad-frame skip|stop] [--save-every N] [--checkpoint-every N]
        [--labels-at frame|test] [--realtime COST|measure] [--limit N]
        [--cfg-options k=v ...]
        [--device DEV] [--threads N] [--workers N] [--verbose]
        [--trust-pickle]
    python tools/adapt.py --resume --out-dir DIR

INPUT is an image folder (every image under it, sorted by path), a text
file listing images (in its order), a video file, a camera index (``0``)
or a stream URL (``rtsp://…``, ``http://…``). Each frame is predicted,
then adapted on, by the config's method
(``mmseg_stag.apis.OnlineInferencer``: the step of ``tools/test.py``'s
loop). DIR gets:

- ``labels/<index>_<name>.png``: each frame's label map (palette PNG, the
  config's classes and colours, the frame's size); ``overlays/`` with
  ``--overlay``;
- ``frames.csv``: per frame its index, file, time in the video, status
  (``ok`` or ``skipped`` and why), the method's statistics (``loss``,
  ``loss_stag``, ``beta``, …) and the restarts from the source (with
  ``--realtime``, ``adapted``: 0 for a frame predicted only);
- ``checkpoints/adapted_final.pth`` (and every ``--checkpoint-every``
  frames): the adapted weights, which ``tools/test.py``,
  ``OnlineInferencer`` and MMSeg's inferencer read;
- ``adapt_state.pth`` every ``--save-every`` frames and when stopped
  (Ctrl-C, SIGTERM): ``--resume`` continues from it, with the run's own
  options (``adapt_run.json``), to the result of an uninterrupted run;
- ``prediction.mp4`` with ``--video`` (the overlays, or the label colours,
  at the input's frame rate), ``summary.json``, and the run's log.

docs/adapt.md says more.
"""
import argparse
import ast
import json
import os
import os.path as osp
import queue
import signal
import sys
import threading
import time
import warnings

import numpy as np

REPO = osp.dirname(osp.dirname(osp.abspath(__file__)))
if REPO not in sys.path:  # the package, not installed in a checkout
    sys.path.insert(0, REPO)

ADAPT_STATE_FILE = 'adapt_state.pth'
RUN_FILE = 'adapt_run.json'
CSV_FILE = 'frames.csv'
#: the options a run keeps (``adapt_run.json``): a resume reuses them, and
#: refuses another value; their defaults
RUN_OPTIONS = dict(overlay=False, opacity=0.5, video=False, fps=None,
                   reset_every=None, stage_frames=None, on_nonfinite='stop',
                   on_bad_frame='skip', save_every=100, checkpoint_every=0,
                   labels_at='frame', realtime=None, limit=None,
                   trust_pickle=False, cfg_options=None)
POSITIONALS = ('config', 'checkpoint', 'input')


def realtime_cost(text: str):
    """``--realtime``'s value: a number > 0, or ``measure`` (as
    ``tools/test.py``'s: tests/tools/test_realtime_argument.py)."""
    if text == 'measure':
        return text
    try:
        cost = float(text)
    except ValueError:
        cost = float('nan')
    if not cost > 0 or cost == float('inf'):
        raise argparse.ArgumentTypeError(
            f'{text!r}: a step\'s cost in forwards, a number > 0, or '
            'measure')
    return cost


def parse_args(argv=None):
    from mmengine.config import DictAction
    parser = argparse.ArgumentParser(
        description='adapt a segmentor online on an image folder, a list of '
        'images, a video, a camera or a stream, without labels, and write '
        'its predictions')
    add = parser.add_argument
    # a run's options default to None here: a resume tells the ones given
    # from the ones left out (RUN_OPTIONS holds the defaults)
    add('config', nargs='?', help='a config of the online loop '
        '(configs/stag_acdc); with --resume, the run\'s')
    add('checkpoint', nargs='?', help='the source weights')
    add('input', nargs='?', help='an image folder, a .txt list of images, '
        'a video, a camera index (0) or a stream URL (rtsp://, http://)')
    add('--out-dir', required=True, help='where the predictions go')
    add('--overlay', action='store_true', default=None, help='also write '
        'each frame with its label colours blended in (overlays/)')
    add('--opacity', type=float, help='the overlay\'s label opacity '
        '(default 0.5)')
    add('--video', action='store_true', default=None, help='also write '
        'prediction.mp4: the overlays (or the label colours) at the '
        'input\'s frame rate')
    add('--fps', type=float, help='the output video\'s rate for image '
        'input (default 10), or to replace a video\'s')
    add('--show', action='store_true', help='show each frame with its '
        'labels in a window (needs a display; q or Esc stops the run as '
        'Ctrl-C does)')
    add('--reset-every', type=int, metavar='N', help='restart from the '
        'source weights after every N frames (default: never)')
    add('--stage-frames', type=int, metavar='N', help='a new stage every N '
        'frames: what the config restarts per stage (STAG\'s beta_t in the '
        '+STAG configs) restarts (default: one stage; ACDC\'s are 400)')
    add('--on-nonfinite', choices=('stop', 'reset'), help='a non-finite '
        'loss: stop, as tools/test.py, or restart from the source weights '
        'and go on (default stop)')
    add('--on-bad-frame', choices=('skip', 'stop'), help='an unreadable '
        'frame: skip it (named in the log and the CSV) or stop (default '
        'skip)')
    add('--save-every', type=int, metavar='N', help='write the state '
        '--resume continues from every N frames (default 100; 0: only at '
        'the end or when stopped)')
    add('--checkpoint-every', type=int, metavar='N', help='also save the '
        'adapted weights every N frames (default: at the end only)')
    add('--labels-at', choices=('frame', 'test'), help='make the label '
        'map at the frame\'s size (MMSeg\'s: logits resized, then argmax; '
        'default) or at the config\'s test scale, then resized to the '
        'frame (nearest): much less work on large frames, a little '
        'coarser')
    add('--realtime', metavar='COST', type=realtime_cost, help='the '
        'realistic online protocol (docs/realtime.md): a step costs COST '
        'forwards and the frames that come during it are predicted '
        'without an update; measure: the cost timed on the first frame')
    add('--limit', type=int, metavar='N', help='the first N frames only')
    add('--trust-pickle', action='store_true', default=None, help='allow '
        'a legacy pickle checkpoint (trusted files only)')
    add('--cfg-options', nargs='+', action=DictAction, help='override '
        'config settings, as tools/test.py')
    add('--resume', action='store_true', help='continue the run in '
        '--out-dir from its last saved state, with its own config, '
        'checkpoint, input and options')
    add('--device', help='cpu, cuda or cuda:N (default: CUDA where there '
        'is one)')
    add('--threads', type=int, metavar='N', help='CPU threads of the '
        'model on a CPU (default: the cores this process may use, less the '
        'decoding workers; 1 on a busy machine, see docs/adapt.md)')
    add('--workers', type=int, help='processes decoding image files '
        '(default: the config\'s loader workers)')
    add('--verbose', action='store_true', help='print MMEngine\'s '
        'environment and config dump and the per-frame log lines (always '
        'in the log file)')
    args = parser.parse_args(argv)
    try:
        resolve_run_options(args)
    except ValueError as err:  # one sentence, as every refusal here
        raise SystemExit(f'error: {err}') from None
    for key in ('reset_every', 'stage_frames', 'limit', 'threads'):
        value = getattr(args, key)
        if value is not None and value < 1:
            parser.error(f'--{key.replace("_", "-")} must be >= 1')
    for key in ('save_every', 'checkpoint_every', 'workers'):
        if (getattr(args, key) or 0) < 0:
            parser.error(f'--{key.replace("_", "-")} must be >= 0')
    if not 0 <= args.opacity <= 1:
        parser.error('--opacity must be in [0, 1]')
    if args.fps is not None and args.fps <= 0:
        parser.error('--fps must be > 0')
    return args


def run_record(args) -> dict:
    """What ``adapt_run.json`` keeps of a run: its config, checkpoint and
    input (absolute, unless a camera or URL), and its options
    (``--cfg-options`` as Python literals: a tuple stays a tuple)."""
    from mmseg_stag.apis.frames import is_live_input
    record = {k: getattr(args, k) for k in RUN_OPTIONS}
    record['cfg_options'] = repr(args.cfg_options) if args.cfg_options \
        else None
    for key in POSITIONALS:
        value = getattr(args, key)
        record[key] = value if key == 'input' and is_live_input(value) \
            else osp.abspath(value)
    return record


def resolve_run_options(args) -> None:
    """Fill ``args``' run options: a fresh run's from their defaults, a
    resume's from ``adapt_run.json``; ``ValueError`` for a resume given
    another value than the run's, or a fresh run without its inputs."""
    from mmseg_stag.apis.frames import is_live_input
    if not args.resume:
        missing = [k.upper() for k in POSITIONALS if getattr(args, k) is None]
        if missing:
            raise ValueError(f'{" ".join(missing)} needed (only --resume '
                             'takes them from the run in --out-dir)')
        for key, default in RUN_OPTIONS.items():
            if getattr(args, key) is None:
                setattr(args, key, default)
        return
    path = osp.join(args.out_dir, RUN_FILE)
    if not osp.isfile(path):
        raise ValueError(f'--resume: no run to continue in {args.out_dir} '
                         f'(no {RUN_FILE}); run without --resume to start '
                         'it')
    try:
        with open(path) as f:
            saved = json.load(f)
        saved['cfg_options'] = ast.literal_eval(saved['cfg_options']) \
            if saved.get('cfg_options') else None
    except (OSError, ValueError, SyntaxError, KeyError) as err:
        raise ValueError(f'--resume: {path} cannot be read ({err})') from None
    differ = []
    for key in POSITIONALS + tuple(RUN_OPTIONS):
        given, kept = getattr(args, key), saved.get(key, RUN_OPTIONS.get(key))
        if key in POSITIONALS and given is not None and not is_live_input(
                given):
            given = osp.abspath(given)
        if given is not None and given != kept:
            differ.append(f'{key.replace("_", "-")} {given!r} (the run\'s: '
                          f'{kept!r})')
        setattr(args, key, kept)
    if differ:
        raise ValueError(
            f'--resume continues the run in {args.out_dir} with its own '
            'options; leave out or match: ' + '; '.join(differ))


# ------------------------------------------------------------- the frames
def passthrough(item):
    return item


def quiet_worker(_):
    """A decoding worker leaves Ctrl-C to the main process, which stops
    after the frame it is on; OpenCV in one thread (the workers are the
    parallelism: more threads oversubscribe the cores)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    import cv2
    cv2.setNumThreads(1)


class FrameFiles:
    """Image files through the pipeline in loader workers; a frame that
    fails (unreadable, truncated) comes back with why instead of data."""

    def __init__(self, source, pipeline, start, stop):
        self.source, self.pipeline = source, pipeline
        self.start, self.stop = start, stop

    def __len__(self):
        return self.stop - self.start

    def __getitem__(self, i):
        from mmseg_stag.apis.adapt_outputs import one_line
        from mmseg_stag.segmentation.datasets.frame_stream import frame_info
        index = self.start + i
        path = self.source.files[index]
        try:
            data = self.pipeline(frame_info(index, path))
        except Exception as err:  # the reason goes to the log and the CSV
            return index, None, None, one_line(f'{type(err).__name__}: '
                                               f'{err}')
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
                        generator=torch.Generator(),
                        worker_init_fn=quiet_worker if workers else None)
    yield from loader


def decoded_frames(frames, inferencer):
    """``(index, data, image, why)`` of a video's decoded ``(index,
    image)`` frames, through the pipeline in a thread ahead of the
    steps."""
    from mmseg_stag.apis.adapt_outputs import one_line
    from mmseg_stag.segmentation.datasets.frame_stream import frame_info
    pipeline = inferencer.pipeline(True)
    ahead: queue.Queue = queue.Queue(maxsize=8)
    done, halt = object(), threading.Event()

    def decode():
        try:
            for index, image in frames:
                if halt.is_set():
                    break
                try:
                    item = (index, pipeline(frame_info(index, image=image)),
                            image, None)
                except Exception as err:
                    item = (index, None, image,
                            one_line(f'{type(err).__name__}: {err}'))
                ahead.put(item)
        finally:
            ahead.put(done)

    thread = threading.Thread(target=decode, daemon=True)
    thread.start()
    try:
        while True:
            item = ahead.get()
            if item is done:
                break
            yield item
    finally:
        halt.set()
        while thread.is_alive():  # unblock a decoder waiting to put
            try:
                ahead.get(timeout=0.1)
            except queue.Empty:
                pass
        thread.join()


def live_frames(source, inferencer, start, stop):
    """``(index, data, image, why)`` of a camera or stream: its reader
    thread keeps the newest frame only, taken when the step before is
    done (no queue ahead: the frames that come while a step runs are
    dropped, counted); numbered on from ``start`` (a resumed run)."""
    from mmseg_stag.apis.adapt_outputs import one_line
    from mmseg_stag.segmentation.datasets.frame_stream import frame_info
    pipeline = inferencer.pipeline(True)
    frames = source.live_frames(None if stop == sys.maxsize else
                                stop - start)
    try:
        for taken, image in frames:
            index = start + taken
            try:
                yield (index, pipeline(frame_info(index, image=image)),
                       image, None)
            except Exception as err:
                yield index, None, image, one_line(
                    f'{type(err).__name__}: {err}')
    finally:
        frames.close()


def frames_of(source, inferencer, start, stop, workers):
    """The frames of any input, from ``start`` to ``stop``."""
    if source.live:
        return live_frames(source, inferencer, start, stop)
    if source.kind == 'video':
        def until_stop():
            for index, image in source.video_frames(start):
                if index >= stop:
                    return
                yield index, image
        return decoded_frames(until_stop(), inferencer)
    return file_frames(source, inferencer, start, stop, workers)


class StopRequest:
    """Ctrl-C (SIGINT) and SIGTERM stop the run after the frame it is on,
    with its state saved (``--resume`` goes on from there); a second one
    stops at once. Installed for the run, the old handlers restored."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self):
        self.why, self.old = None, {}

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for sig in self.SIGNALS:
                self.old[sig] = signal.signal(sig, self.handle)
        return self

    def __exit__(self, *exc):
        for sig, handler in self.old.items():
            signal.signal(sig, handler)

    def handle(self, signum, frame):
        if self.why is not None:  # the second: at once
            raise KeyboardInterrupt
        self.request(signal.Signals(signum).name)

    def request(self, why):
        self.why = why
        sys.stderr.write(f'\n{why}: stopping after this frame and saving '
                         'the state (again: stop at once, unsaved)\n')
        sys.stderr.flush()


class Window:
    """``--show``: each frame with its labels in a window; q or Esc asks
    the run to stop."""

    def __init__(self, title):
        env = os.environ
        if sys.platform.startswith('linux') and not (
                env.get('DISPLAY') or env.get('WAYLAND_DISPLAY')):
            raise SystemExit('error: --show needs a display (neither DISPLAY '
                             'nor WAYLAND_DISPLAY is set); --video or '
                             '--overlay write the same pictures')
        self.title = title

    def show(self, picture, stop: StopRequest) -> None:
        import cv2
        cv2.imshow(self.title, picture)
        if cv2.waitKey(1) & 0xFF in (ord('q'), 27) and stop.why is None:
            stop.request('window closed (q)')

    def close(self) -> None:
        import cv2
        try:
            cv2.destroyWindow(self.title)
        except cv2.error:  # already closed by the user
            pass


def read_image(path):
    import cv2
    return cv2.imread(path, cv2.IMREAD_COLOR)


# ---------------------------------------------------------------- the run
def check_out_dir(args):
    """A fresh run needs an out dir without a run; ``--resume`` one with."""
    state = osp.join(args.out_dir, ADAPT_STATE_FILE)
    if args.resume and not osp.isfile(state):
        raise SystemExit(f'error: --resume: no state to continue from in '
                         f'{args.out_dir} (no {ADAPT_STATE_FILE}: the run '
                         'stopped before its first save); run without '
                         '--resume to start it again')
    if not args.resume and (osp.isfile(state) or osp.isfile(
            osp.join(args.out_dir, RUN_FILE))):
        raise SystemExit(f'error: {args.out_dir} holds a run '
                         f'({ADAPT_STATE_FILE}): --resume continues it, or '
                         'give another --out-dir')


def input_record(source):
    return dict(path=source.path if source.live
                else osp.abspath(source.path), kind=source.kind,
                count=source.count)


def save_state(path, inferencer, source, next_frame, skipped):
    from mmseg_stag.engine.run_state import save_run_state
    save_run_state(path, dict(inferencer=inferencer.state_dict(),
                              input=input_record(source),
                              next_frame=int(next_frame),
                              skipped=list(skipped)))


def read_state(path, source, args):
    """The saved state, checked against this input, config and weights
    before anything is built or written (``SystemExit`` naming what
    differs: a refused resume changes nothing)."""
    from mmseg_stag.apis.online_inferencer import resume_differences
    from mmseg_stag.engine.run_state import load_run_state
    try:
        state = load_run_state(path)
    except RuntimeError as err:  # corrupt, truncated, another version
        raise SystemExit(f'error: --resume: {err}') from None
    saved, now = state['input'], input_record(source)
    if saved != now:
        raise SystemExit(f'error: --resume: {path} adapted on {saved}, this '
                         f'input is {now}')
    try:
        diffs = resume_differences(args.config, args.checkpoint,
                                   state['inferencer'], args.out_dir,
                                   args.cfg_options, args.trust_pickle,
                                   args.realtime)
    except (OSError, ValueError) as err:
        raise SystemExit(f'error: --resume: {err}') from None
    if diffs:
        raise SystemExit(
            f'error: --resume: {path} is of another run ({len(diffs)} '
            'difference(s)):\n  ' + '\n  '.join(diffs))
    return state


def cpu_threads(args, workers, inferencer):
    """The model's CPU threads: ``--threads``, else the cores this process
    may use less the decoding workers (on a CPU; a GPU run leaves torch's
    default)."""
    import torch
    if args.threads is None and inferencer.model_device.type != 'cpu':
        return None
    cores = len(os.sched_getaffinity(0)) if hasattr(
        os, 'sched_getaffinity') else os.cpu_count() or 1
    threads = args.threads or max(1, cores - workers)
    torch.set_num_threads(threads)
    return threads


def say(message, level=20):
    """A line on the console and in the run's log."""
    from mmengine.logging import print_log
    print_log(message, logger='current', level=level)
    if level < 30:  # the console shows warnings itself
        print(message, flush=True)


#: the libraries' own chatter (deprecations, defaults they announce): off
#: the console without --verbose
QUIET_WARNINGS = r'(mmseg|mmengine|mmcv|pkg_resources|importlib)(\.|$)'


def main(argv=None) -> int:
    args = parse_args(argv)
    with warnings.catch_warnings():
        if not args.verbose:
            warnings.filterwarnings('ignore', module=QUIET_WARNINGS)
        return run(args)


def run(args) -> int:
    from mmseg_stag.apis import OnlineInferencer, open_frames
    check_out_dir(args)
    try:
        source = open_frames(args.input)
    except (OSError, ValueError) as err:
        raise SystemExit(f'error: {err}') from None
    window = Window(f'adapt: {args.input}') if args.show else None
    state_path = osp.join(args.out_dir, ADAPT_STATE_FILE)
    state = read_state(state_path, source, args) if args.resume else None
    os.makedirs(args.out_dir, exist_ok=True)
    try:
        inferencer = OnlineInferencer(
            args.config, args.checkpoint, work_dir=args.out_dir,
            cfg_options=args.cfg_options, reset_every=args.reset_every,
            stage_frames=args.stage_frames, on_nonfinite=args.on_nonfinite,
            trust_pickle=args.trust_pickle, device=args.device,
            labels_at=args.labels_at, quiet=not args.verbose,
            realtime=args.realtime)
    except (OSError, ValueError) as err:
        raise SystemExit(f'error: {err}') from None
    start, skipped = 0, []
    if state is not None:
        inferencer.load_state_dict(state['inferencer'])
        start, skipped = state['next_frame'], state['skipped']
    else:
        from mmseg_stag.engine.report import write_json
        write_json(osp.join(args.out_dir, RUN_FILE), run_record(args))
    try:
        return adapt(args, inferencer, source, start, skipped, window)
    finally:
        inferencer.close()
        if window:
            window.close()


def adapt(args, inferencer, source, start, skipped, window) -> int:
    """The frames from ``start`` on, each predicted, written, adapted on;
    then the state, the adapted weights, the video and the summary."""
    from mmseg_stag.apis.adapt_outputs import (FrameTable, Progress, Writer,
                                               resize_labels)
    state_path = osp.join(args.out_dir, ADAPT_STATE_FILE)
    stop = min(source.count or sys.maxsize, args.limit or sys.maxsize)
    if stop <= start:
        raise SystemExit(f'error: the run in {args.out_dir} is done: '
                         f'{start} frames adapted on (of {stop})')
    workers = inferencer.workers if args.workers is None else args.workers
    threads = cpu_threads(args, workers, inferencer)
    say(f'adapting on {source.path} ({source.kind}, '
        f'{source.count or "unknown number of"} frames, {source.order}) '
        f'from frame {start} on {inferencer.model_device}'
        + (f' ({threads} threads, {workers} decoding workers)' if threads
           else '') + f'; predictions to {args.out_dir}')
    writer = Writer(args.out_dir, inferencer.palette, args.overlay,
                    args.opacity)
    table = FrameTable(osp.join(args.out_dir, CSV_FILE),
                       resume_at=start if args.resume else None,
                       extra=('adapted', ) if args.realtime else ())
    frames = frames_of(source, inferencer, start, stop, workers)
    progress = Progress(stop - start if stop < sys.maxsize else None)
    started, stepped, next_frame = time.perf_counter(), 0, start
    predicted = []  # --realtime: the wall times of the frames predicted only
    with StopRequest() as stop_request:
        try:
            for index, data, image, why in frames:
                name = source.name(index)
                # a live source's times are of the frames taken this run
                row = dict(index=index, file=name, seconds=source.seconds(
                    index - start if source.live else index))
                if data is None:
                    skipped.append(dict(index=index, file=name, why=why))
                    say(f'frame {index} ({name}) skipped: {why}', level=30)
                    if args.on_bad_frame == 'stop':
                        raise SystemExit(
                            f'error: frame {index} ({name}) cannot be read: '
                            f'{why} (--on-bad-frame skip goes on without it)')
                    table.add(dict(row, status='skipped', reason=why), {})
                else:
                    begun = time.perf_counter()
                    sample, stats = inferencer.step(data, name)
                    labels = sample.pred_sem_seg.data[0].cpu().numpy(
                    ).astype(np.uint8)  # on a GPU: the forward waited for
                    if stats.get('adapted') is False:
                        predicted.append(time.perf_counter() - begun)
                    if 'frame_shape' in sample.metainfo:  # --labels-at test
                        labels = resize_labels(labels,
                                               sample.metainfo['frame_shape'])
                    def image_of(image=image, name=name):
                        # a video's decoded frame, or the file read again
                        return image if image is not None else \
                            read_image(name)
                    overlay = writer.write(index, name, labels, image_of)
                    if window:
                        window.show(overlay if overlay is not None else
                                    writer.blend(image_of(), labels),
                                    stop_request)
                    table.add(dict(row, status='ok',
                                   reason=stats.pop('nonfinite', None)),
                              stats)
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
                if stop_request.why:
                    break
        finally:
            frames.close()
            table.close()
            progress.close()
    return finish(args, inferencer, source, writer, dict(
        start=start, next_frame=next_frame, stepped=stepped,
        skipped=skipped, seconds=time.perf_counter() - started,
        stopped=stop_request.why, stop=stop, predicted=predicted))


def finish(args, inferencer, source, writer, run) -> int:
    """The state; unless nothing was adapted on, the adapted weights, the
    video and the summary; the exit code (130 when stopped)."""
    from mmseg_stag.apis.adapt_outputs import write_video
    from mmseg_stag.engine.report import write_json
    state_path = osp.join(args.out_dir, ADAPT_STATE_FILE)
    next_frame, skipped = run['next_frame'], run['skipped']
    ended = source.ended_early()
    if ended:
        say(f'{source.path}: {ended}', level=30)
    if next_frame - len(skipped) <= 0:
        first = skipped[0]['why'] if skipped else 'no frame came'
        if not args.resume:  # no run to resume: the out dir takes a new one
            os.remove(osp.join(args.out_dir, RUN_FILE))
        raise SystemExit(
            f'error: nothing adapted on: {source.path} gave no frame the '
            f'model could read ({len(skipped)} skipped; the first: {first})'
            '; no checkpoint written')
    save_state(state_path, inferencer, source, next_frame, skipped)
    if run['stopped']:
        say(f'stopped ({run["stopped"]}) after frame {next_frame - 1}; the '
            f'state is saved: python tools/adapt.py --resume --out-dir '
            f'{args.out_dir}')
    final = osp.join(args.out_dir, 'checkpoints', 'adapted_final.pth')
    inferencer.save_checkpoint(final)
    video = None
    if args.video:
        fps = args.fps or source.fps or 10.0
        made = write_video(args.out_dir, writer.overlays or writer.labels,
                           '.jpg' if writer.overlays else '.png', fps)
        if made:
            video, count, boxed = made
            if boxed:
                say(f'{video}: {boxed} of {count} frames had another size '
                    'than the first and are letterboxed into it')
    seconds, stepped = run['seconds'], run['stepped']
    summary = dict(input=source.path, kind=source.kind, order=source.order,
                   frames=next_frame, stepped_this_run=stepped,
                   skipped=skipped, resets=inferencer.resets,
                   dropped=source.dropped if source.live else None,
                   dropped_frames=source.dropped_note() if source.live
                   else None,
                   ended_early=ended, stopped=run['stopped'],
                   seconds_this_run=round(seconds, 3),
                   frames_per_second=round(stepped / seconds, 3)
                   if seconds > 0 else None,
                   checkpoint=final, video=video, config=args.config,
                   source_checkpoint=args.checkpoint,
                   labels_at=args.labels_at)
    line = None
    if args.realtime is not None:
        summary['realtime'], line = realtime_part(args, inferencer, source,
                                                  run['predicted'])
    write_json(osp.join(args.out_dir, 'summary.json'), summary)
    say(f'adapted on {next_frame} frames ({len(skipped)} skipped, '
        f'{len(inferencer.resets)} restarts from the source'
        + (f'; {source.dropped_note()}' if source.live and source.dropped
           else '') + f'); {stepped} '
        f'this run in {seconds:.1f} s ({summary["frames_per_second"]} '
        f'frames/s); {args.out_dir}/{CSV_FILE}, labels/, {final}')
    if line:
        say(line)
    return 130 if run['stopped'] else 0


def realtime_part(args, inferencer, source, predicted):
    """``--realtime``'s entry of ``summary.json`` and its console line: the
    frames adapted and whether the forward keeps up with the input's
    frame rate (a video's or a capture's, or ``--fps``; an image folder
    or list has none)."""
    from mmseg_stag.apis.adapt_outputs import realtime_summary
    fps = None if source.kind in ('folder', 'list') else (
        args.fps or source.fps)
    mean = sum(predicted) / len(predicted) if predicted else None
    return realtime_summary(inferencer.realtime_record(), mean, fps)


if __name__ == '__main__':
    sys.exit(main())
