"""What ``tools/adapt.py`` writes: each frame's label map and overlay, the
per-frame table, the output video and the console's progress line."""
import csv
import os
import os.path as osp
import sys
import time
from datetime import timedelta
from typing import Callable, Optional, TextIO

import numpy as np

#: the CSV's first columns; the method's statistics follow
FRAME_COLUMNS = ['index', 'file', 'seconds', 'status', 'reason']


def one_line(text) -> str:
    """``text`` on one line: an OpenCV or PIL message can hold newlines,
    which would split a CSV row or a log line."""
    return ' '.join(str(text).split())


def resize_labels(labels: np.ndarray, shape) -> np.ndarray:
    """A label map made at the network's size, at the frame's (nearest:
    labels are not blended)."""
    import cv2
    height, width = int(shape[0]), int(shape[1])
    if labels.shape[:2] == (height, width):
        return labels
    return cv2.resize(labels, (width, height),
                      interpolation=cv2.INTER_NEAREST)


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

    def colour(self, labels: np.ndarray) -> np.ndarray:
        """The label map in its palette colours, BGR."""
        return self.colours[labels][..., ::-1]

    def blend(self, image: np.ndarray, labels: np.ndarray) -> np.ndarray:
        import cv2
        return cv2.addWeighted(image, 1 - self.opacity, self.colour(labels),
                               self.opacity, 0)

    def write(self, index: int, name: str, labels: np.ndarray,
              image_of: Callable[[], np.ndarray]) -> Optional[np.ndarray]:
        """Write the label map (and the overlay); return the overlay, or
        None without ``--overlay``."""
        from PIL import Image
        stem = self.stem(index, name)
        png = Image.fromarray(labels, mode='P')
        png.putpalette(self.colours.reshape(-1).tolist())
        save_atomic_image(png, osp.join(self.labels, stem + '.png'))
        if not self.overlays:
            return None
        import cv2
        blend = self.blend(image_of(), labels)
        cv2.imwrite(osp.join(self.overlays, stem + '.jpg'), blend)
        return blend


def save_atomic_image(image, path):
    """A PIL image written whole or not at all (a crash leaves no half
    file)."""
    tmp = path + '.tmp'
    image.save(tmp, format='PNG')
    os.replace(tmp, path)


def letterbox(image: np.ndarray, width: int, height: int) -> np.ndarray:
    """``image`` scaled to fit ``width × height``, its aspect kept, the
    rest black: a video has one frame size, footage may not."""
    import cv2
    h, w = image.shape[:2]
    if (w, h) == (width, height):
        return image
    scale = min(width / w, height / h)
    new_w, new_h = max(1, round(w * scale)), max(1, round(h * scale))
    out = np.zeros((height, width, 3), np.uint8)
    top, left = (height - new_h) // 2, (width - new_w) // 2
    out[top:top + new_h, left:left + new_w] = cv2.resize(
        image, (new_w, new_h), interpolation=cv2.INTER_AREA)
    return out


def write_video(out_dir: str, frames_dir: str, suffix: str, fps: float):
    """The frames of ``frames_dir`` (in order) as ``prediction.mp4``, one
    video frame each: frames of another size than the first letterboxed
    into it. Return ``(path, frames written, frames letterboxed)``, or
    None when there is no frame."""
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
    boxed = 0
    try:
        for name in names:
            frame = cv2.imread(osp.join(frames_dir, name), cv2.IMREAD_COLOR)
            if frame.shape[:2] != (height, width):
                boxed += 1
                frame = letterbox(frame, width, height)
            video.write(frame)
    finally:
        video.release()
    return path, len(names), boxed


class FrameTable:
    """``frames.csv``, a row a frame, flushed at once; on a resume the
    rows from the resumed frame on are dropped first. ``extra``: columns
    after the first ones whatever the first row holds (``adapted`` with
    ``--realtime``: 1, or 0 for a frame predicted only)."""

    def __init__(self, path, resume_at=None, extra=()):
        self.path, self.columns, self.file = path, None, None
        self.extra = list(extra)
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
            self.columns = FRAME_COLUMNS + self.extra + sorted(
                k for k in stats if k not in (
                    'reset', 'nonfinite', *self.extra)) + ['reset']
            self.open()
        row = {k: one_line(v) if isinstance(v, str) else
               int(v) if isinstance(v, bool) else v
               for k, v in {**row, **stats}.items()}
        self.writer.writerow(row)
        self.file.flush()

    def close(self):
        if self.file:
            self.file.close()


def clock(seconds: float) -> str:
    """``seconds`` as ``H:MM:SS`` (as tools/reproduce.py prints times)."""
    return str(timedelta(seconds=max(0, int(round(seconds)))))


class Progress:
    """The console's progress: frames done, the recent rate and the ETA
    of what is left at that rate (none for a stream of unknown length).
    On a terminal one line redrawn; elsewhere (a log, CI) a line every
    ``every`` seconds.

    The rate is over the last ``window`` frames, the first frame left out
    (its step builds the optimizer, a graph, the caches): an ETA from the
    whole run's mean would be wrong for long after a slow start."""

    def __init__(self, total: Optional[int], done: int = 0,
                 file: TextIO = None, window: int = 50, every: float = 10.,
                 now: Callable[[], float] = time.perf_counter):
        self.total, self.done = total, done
        self.file = file or sys.stderr
        self.tty = getattr(self.file, 'isatty', lambda: False)()
        self.window, self.every, self.now = window, every, now
        self.times = []
        self.shown = None

    def rate(self) -> Optional[float]:
        if len(self.times) < 2:
            return None
        span = self.times[-1] - self.times[0]
        return (len(self.times) - 1) / span if span > 0 else None

    def line(self) -> str:
        rate = self.rate()
        text = f'{self.done}' + (f'/{self.total}' if self.total else '') + \
            ' frames'
        if rate:
            text += f', {rate:.2f} frames/s'
            if self.total:
                text += f', ETA {clock((self.total - self.done) / rate)}'
        return text

    def update(self, n: int = 1, extra: str = '') -> None:
        self.done += n
        self.times = (self.times + [self.now()])[-(self.window + 1):]
        t = self.times[-1]
        if self.tty:
            self.file.write(f'\r{self.line()}{extra}\x1b[K')
        elif self.shown is None or t - self.shown >= self.every or (
                self.total and self.done >= self.total):
            self.file.write(f'{self.line()}{extra}\n')
        else:
            return
        self.shown = t
        self.file.flush()

    def close(self) -> None:
        if self.tty and self.shown is not None:
            self.file.write('\n')
            self.file.flush()


def milliseconds(seconds: float) -> str:
    return f'{seconds * 1000:.0f} ms'


def realtime_summary(record: dict, predicted_seconds: Optional[float],
                     fps: Optional[float]):
    """``--realtime``'s part of the summary: ``(entry, line)``, the
    protocol's record (:meth:`OnlineInferencer.realtime_record`) with
    whether the forward alone keeps up with the input's frame rate
    ``fps`` (None: an image folder or list, no rate). The forward's time
    is the measured one (``cost='measure'``), else
    ``predicted_seconds``, the mean wall time of this run's frames
    predicted only (None: none was)."""
    adapted = record['batches_adapted']
    frames = adapted + record['batches_predicted_only']
    measured = record.get('measured')
    if measured:
        how = (f'measured: step {milliseconds(measured["step_seconds"])}, '
               f'forward {milliseconds(measured["forward_seconds"])}')
        forward, timed = measured['forward_seconds'], 'measured'
    else:
        how, forward = record['how'], predicted_seconds
        timed = 'frames predicted only' if forward is not None else None
    cost = 'unmeasured' if record['cost'] is None else \
        f'{record["cost"]:.3g}'
    line = f'realtime: {adapted} of {frames} frames adapted (cost {cost}, ' \
        f'{how})'
    keeps_up = None
    if not fps:
        line += '; the input has no frame rate to compare the forward with'
    elif forward is None:
        line += '; no frame was predicted only, no forward to time'
    else:
        every = 1 / fps
        keeps_up = forward <= every
        line += ('; the forward keeps up with the input' if keeps_up else
                 '; the forward does not keep up with the input') + (
            f' ({milliseconds(forward)} a forward, the input gives a frame '
            f'every {milliseconds(every)})')
    entry = dict(record, frames_adapted=adapted,
                 frames_predicted_only=frames - adapted,
                 forward_seconds=forward, forward_timed=timed,
                 input_fps=fps, forward_keeps_up=keeps_up)
    return entry, line
