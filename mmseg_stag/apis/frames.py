"""Where a user's frames come from: an image folder (sorted by path), a
text file listing images, a video file, a camera or a network stream;
each frame read as the config's pipeline reads it, a bad one named rather
than fatal.

An input that cannot give a frame is refused by :func:`open_frames`, in
one sentence naming it, before a model is built: a list naming no image
file, a video OpenCV cannot open or decode, a camera or a URL that does
not open. A video that decodes only in part is learned at its end
(:meth:`FrameSource.ended_early`), since only decoding it finds that."""
import os
import os.path as osp
import re
import threading
import time
from dataclasses import dataclass, field
from typing import Iterator, List, Optional, Tuple

import numpy as np

IMAGE_SUFFIXES = ('.png', '.jpg', '.jpeg', '.bmp', '.tif', '.tiff', '.webp',
                  '.ppm', '.pgm', '.pbm')
VIDEO_SUFFIXES = ('.mp4', '.avi', '.mov', '.mkv', '.webm', '.m4v', '.mpg',
                  '.mpeg', '.wmv', '.ts')
#: a list file: one image a line, relative to the list's folder
LIST_SUFFIXES = ('.txt', '.lst')
#: the URLs read as a live stream (through OpenCV's FFmpeg)
STREAM_SCHEMES = ('rtsp://', 'rtsps://', 'http://', 'https://', 'udp://',
                  'tcp://', 'rtmp://')
#: seconds a camera or stream may take to open, and to give its next frame
LIVE_TIMEOUT = 10.0
#: missing files of a list named in its refusal
MISSING_SHOWN = 3
#: a video container's first bytes (offset, bytes), for a file OpenCV
#: cannot open: a damaged video is told from a file that is none
CONTAINERS = (('AVI', ((0, b'RIFF'), (8, b'AVI '))),
              ('MP4/MOV', ((4, b'ftyp'), )), ('MP4/MOV', ((4, b'moov'), )),
              ('MP4/MOV', ((4, b'mdat'), )),
              ('Matroska/WebM', ((0, b'\x1aE\xdf\xa3'), )),
              ('MPEG', ((0, b'\x00\x00\x01\xba'), )),
              ('MPEG-TS', ((0, b'G'), (188, b'G'))),
              ('ASF/WMV', ((0, b'0&\xb2u\x8ef\xcf\x11'), )))


@dataclass
class FrameSource:
    """The frames of one input, in stream order.

    ``kind``: ``folder``, ``list``, ``video``, ``camera`` or ``stream``;
    ``files``: the images of a folder or list (none otherwise); ``count``:
    the frames (a video's, as its container states it; 0, unknown, for a
    live input); ``fps``: a video's or a capture's frame rate (None where
    it states none); ``order``: how the order was chosen, for the log;
    ``live``: a camera or stream, read with :meth:`live_frames`.

    Set while the frames are read: ``decoded``, the frames a video
    decoded, once :meth:`video_frames` ran to the video's end (None
    before, or when the consumer stopped first); ``dropped``, a live
    input's frames overwritten by a newer one before the consumer took
    them; ``frame_numbers``, each taken frame's number in the capture (0,
    1, ... as they arrived): its gaps are the dropped frames."""
    kind: str
    path: str
    files: List[str] = field(default_factory=list)
    count: int = 0
    fps: Optional[float] = None
    order: str = ''
    live: bool = False
    timeout: float = LIVE_TIMEOUT
    decoded: Optional[int] = None
    dropped: int = 0
    frame_numbers: List[int] = field(default_factory=list)
    _times: List[float] = field(default_factory=list, repr=False)
    _why_ended: Optional[str] = field(default=None, repr=False)

    def name(self, index: int) -> str:
        """How a frame is named in logs and the CSV."""
        if self.kind in ('video', 'camera', 'stream'):
            return f'{self.path}#{index}'
        return self.files[index]

    def seconds(self, index: int) -> Optional[float]:
        """A video frame's time in the video; a live frame's since the
        first frame taken arrived (None for images, or not yet taken)."""
        if self.live:
            taken = self._times
            return taken[index] - taken[0] if index < len(taken) else None
        return index / self.fps if self.kind == 'video' and self.fps else None

    def video_frames(self, start: int = 0
                     ) -> Iterator[Tuple[int, Optional[np.ndarray]]]:
        """``(index, BGR uint8 frame)`` of a video from ``start`` on, as
        OpenCV decodes it (the frames before ``start`` decoded and
        dropped: a codec seeks to key frames only); ``decoded`` set when
        the decoding ends. A live input's are :meth:`live_frames`'."""
        if self.live:
            if start:
                raise ValueError(f'{self.path}: a live input cannot start '
                                 f'at frame {start} (it has no past frames)')
            yield from self.live_frames()
            return
        import cv2
        capture = cv2.VideoCapture(self.path)
        self.decoded = None
        try:
            index = 0
            while True:
                ok, frame = capture.read()
                if not ok:
                    self.decoded = index
                    return
                if index >= start:
                    yield index, frame
                index += 1
        finally:
            capture.release()

    def live_frames(self, stop: Optional[int] = None
                    ) -> Iterator[Tuple[int, np.ndarray]]:
        """``(index, BGR uint8 frame)`` of a camera or stream: the newest
        frame each time one is asked for, so that a model slower than the
        input works on the present rather than on a queue (the frames
        between are ``dropped``); ``index`` counts the frames taken, so the
        outputs number consecutively. Ends after ``stop`` frames, when the
        stream ends, or when no frame comes within ``timeout`` (then
        :meth:`ended_early` says so); closing it stops the reading thread
        and releases the capture."""
        if not self.live:
            raise ValueError(f'{self.path}: not a camera or stream; its '
                             'frames are video_frames() or files')
        # reset before the reader thread starts: it counts drops at once
        self.dropped, self.frame_numbers, self._times = 0, [], []
        self._why_ended = None
        reader = LiveReader(self, open_capture(self.path, self.timeout))
        try:
            while stop is None or len(self.frame_numbers) < stop:
                newest = reader.take()
                if newest is None:
                    break
                number, arrived, image = newest
                self.frame_numbers.append(number)
                self._times.append(arrived)
                yield len(self.frame_numbers) - 1, image
        finally:
            reader.stop()
            self._why_ended = reader.why_ended

    def ended_early(self) -> Optional[str]:
        """Why the frames ended before the input's end, in one sentence
        about the input (the consumer names it: ``f'{path}: {why}'``): a
        video that decoded fewer frames than its container states, a live
        input that stopped giving frames; None otherwise (or not read to
        its end yet)."""
        if self.live:
            return self._why_ended
        if self.decoded is None or not self.count or \
                self.decoded >= self.count:
            return None
        return (f'decoding ended after {self.decoded} of the {self.count} '
                'frames its container states: the file is cut short or '
                f'damaged from frame {self.decoded} on')

    def dropped_note(self, shown: int = 8) -> Optional[str]:
        """Which frames of a live input were dropped, in one sentence
        about the input, as :meth:`ended_early`'s (the first ``shown`` runs
        of them), or None where none was."""
        if not self.dropped:
            return None
        runs, last = [], -1
        for number in self.frame_numbers:
            if number > last + 1:
                runs.append(f'{last + 1}' if number == last + 2 else
                            f'{last + 1}-{number - 1}')
            last = number
        more = ', ...' if len(runs) > shown else ''
        return (f'{self.dropped} frames dropped, a newer one '
                f'arriving before the model took them (capture frames '
                f'{", ".join(runs[:shown])}{more}); '
                f'{len(self.frame_numbers)} taken')


class LiveReader:
    """A thread reading a capture as fast as it gives frames, keeping only
    the newest: a capture read only when the model is ready queues frames
    (in OpenCV, FFmpeg and the network), so each would be older than the
    last. The capture is released by this thread, the one reading it."""

    def __init__(self, source: FrameSource, capture):
        self.source, self.capture = source, capture
        self.changed = threading.Condition()
        self.newest = None  # (capture frame number, arrival time, image)
        self.read = 0
        self.ended = False
        self.why_ended: Optional[str] = None
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True,
                                       name='frames-live-reader')
        self.thread.start()

    def run(self):
        try:
            while not self.stopping.is_set():
                asked = time.monotonic()
                ok, image = self.capture.read()
                arrived = time.monotonic()
                if not ok:
                    self.why_ended = self.why_not(arrived - asked)
                    return
                with self.changed:
                    self.source.dropped += self.newest is not None
                    self.newest = (self.read, arrived, image)
                    self.read += 1
                    self.changed.notify_all()
        except Exception as err:  # a failing backend ends the input, named
            self.why_ended = (f'reading failed after {self.read} frames '
                              f'({type(err).__name__}: {err})')
        finally:
            self.capture.release()
            with self.changed:
                self.ended = True
                self.changed.notify_all()

    def why_not(self, waited: float) -> Optional[str]:
        """Why a read gave no frame: a read that waited out the timeout
        (a stall), a camera that stopped; None for a stream's end."""
        timeout = self.source.timeout
        if self.stopping.is_set():
            return None
        if waited >= 0.9 * timeout:
            return (f'no frame came for {timeout:g} s (the read timeout) '
                    f'after {self.read} frames: the input stalled')
        if self.source.kind == 'camera':
            return f'the camera stopped giving frames after {self.read}'
        return None

    def take(self):
        """The newest frame not taken yet, waiting for one; None once the
        capture gave its last."""
        with self.changed:
            self.changed.wait_for(lambda: self.newest is not None or
                                  self.ended)
            newest, self.newest = self.newest, None
            return newest

    def stop(self):
        """Ends the reading; waits (at most a read's timeout) for the
        thread to release the capture."""
        self.stopping.set()
        self.thread.join(self.source.timeout + 1)


def is_live_input(path: str) -> bool:
    """A camera index (digits) or a stream URL: frames that come live,
    no file to look for."""
    return bool(re.fullmatch(r'[0-9]+', str(path))) or \
        str(path).lower().startswith(STREAM_SCHEMES)


def open_frames(path: str, timeout: float = LIVE_TIMEOUT) -> FrameSource:
    """The frames of ``path``: a folder of images (every image under it,
    sorted by path), a text file listing images (its order; blank lines
    and ``#`` comments skipped; paths relative to the list's folder), a
    video file, a camera index (digits: ``0``, ``1``) or a stream URL
    (``rtsp://``, ``http(s)://``, ``udp://``, ``tcp://``, ``rtmp://``;
    ``timeout`` seconds to open and to give each frame).

    Raises:
        FileNotFoundError: If ``path`` does not exist.
        ValueError: If it holds no frame, its kind is unknown, a list
            names a non-image or missing file, a video cannot be opened or
            decoded, or a camera or stream does not open, in one sentence.
    """
    if is_live_input(path):
        return open_live(path, timeout)
    if not osp.exists(path):
        raise FileNotFoundError(f'input not found: {path}')
    if osp.isdir(path):
        return open_folder(path)
    lower = path.lower()
    if lower.endswith(LIST_SUFFIXES):
        return open_list(path)
    if lower.endswith(VIDEO_SUFFIXES):
        return open_video(path)
    raise ValueError(f'{path}: not a folder, a list ('
                     f'{", ".join(LIST_SUFFIXES)}), a video ('
                     f'{", ".join(VIDEO_SUFFIXES)}), a camera index or a '
                     'stream URL')


def open_folder(path: str) -> FrameSource:
    """Every image under ``path``, sorted by path."""
    files = sorted(
        osp.join(root, name) for root, _, names in os.walk(path)
        for name in names if name.lower().endswith(IMAGE_SUFFIXES))
    if not files:
        raise ValueError(f'{path}: no image in this folder (looked for '
                         f'{", ".join(IMAGE_SUFFIXES)}, sub-folders '
                         'included)')
    return FrameSource('folder', path, files, len(files),
                       order='sorted by path')


def open_list(path: str) -> FrameSource:
    """The images a list names, each line checked before any work: a
    text that is not a list (prose, a list of videos) would otherwise be
    read and every line skipped at run time."""
    base = osp.dirname(osp.abspath(path))
    files = []
    for number, line in list_lines(path):
        if not line.lower().endswith(IMAGE_SUFFIXES):
            raise ValueError(
                f'{path}, line {number}: {line!r} is not an image file (a '
                'list names one image a line, ending in '
                f'{", ".join(IMAGE_SUFFIXES)}; blank lines and # comments '
                'are skipped)')
        files.append((number, line if osp.isabs(line) else
                      osp.join(base, line)))
    if not files:
        raise ValueError(f'{path}: the list names no image')
    missing = [(n, f) for n, f in files if not osp.isfile(f)]
    if missing:
        shown = ', '.join(f'line {n}: {f}' for n, f in
                          missing[:MISSING_SHOWN])
        more = ', ...' if len(missing) > MISSING_SHOWN else ''
        raise ValueError(f'{path}: {len(missing)} of the {len(files)} '
                         f'listed images do not exist ({shown}{more}; '
                         f'relative paths are from {base})')
    return FrameSource('list', path, [f for _, f in files], len(files),
                       order='as listed')


def list_lines(path: str) -> List[Tuple[int, str]]:
    """A list's lines that name something, with their line numbers."""
    try:
        with open(path, encoding='utf-8') as f:
            lines = [line.strip() for line in f]
    except UnicodeDecodeError as err:
        raise ValueError(f'{path}: not a text list (byte {err.start} is not '
                         'UTF-8)') from None
    return [(n, line) for n, line in enumerate(lines, 1)
            if line and not line.startswith('#')]


def open_video(path: str) -> FrameSource:
    """A video's frame count and rate, its first frame decoded to prove
    the codec; a ``ValueError`` that says which of empty, not a video (or
    a damaged one), or an undecodable codec it is otherwise."""
    import cv2
    size = osp.getsize(path)
    if size == 0:
        raise ValueError(f'{path}: the file is empty (0 bytes), not a video')
    capture = cv2.VideoCapture(path)
    try:
        if not capture.isOpened():
            raise ValueError(unopened_video(path, size))
        if not capture.read()[0]:
            codec = printable(int(capture.get(cv2.CAP_PROP_FOURCC) or 0))
            raise ValueError(
                f'{path}: OpenCV cannot decode this video ('
                f'{f"codec {codec!r}" if codec else "its codec unnamed"}): '
                'its container opens but its first frame does not decode; '
                'convert it, e.g. ffmpeg -i INPUT -c:v libx264 out.mp4, or '
                'extract its frames to a folder')
        count = max(int(capture.get(cv2.CAP_PROP_FRAME_COUNT) or 0), 0)
        fps = float(capture.get(cv2.CAP_PROP_FPS) or 0)
    finally:
        capture.release()
    return FrameSource('video', path, [], count, fps if fps > 0 else None,
                       order='the video\'s frame order')


def unopened_video(path: str, size: int) -> str:
    """Why OpenCV opens no video in ``path``, as far as its first bytes
    tell: a known container's header (then it is damaged, cut short, or
    of a codec OpenCV's FFmpeg lacks), or none (then it is no video)."""
    with open(path, 'rb') as f:
        head = f.read(4096)
    container = next((name for name, marks in CONTAINERS
                      if all(head[at:at + len(mark)] == mark
                             for at, mark in marks)), None)
    if container is None:
        text = head[:40]
        begins = f', beginning as text: {" ".join(text.decode().split())!r}'\
            if all(32 <= b < 127 or b in b'\t\n\r' for b in text) else ''
        return (f'{path}: not a video container OpenCV can open ({size} '
                f'bytes{begins})')
    codec = avi_codec(head) if container == 'AVI' else None
    index = '; an MP4/MOV cut short lacks its index (the moov atom, often '\
        'written last)' if container == 'MP4/MOV' else ''
    return (f'{path}: OpenCV cannot open this {container} file ({size} '
            f'bytes{f", codec {codec!r}" if codec else ""}): it is cut short '
            f'or damaged, or its codec has no decoder in OpenCV\'s '
            f'FFmpeg{index}; copy it again, or convert it, e.g. ffmpeg -i '
            'INPUT -c:v libx264 out.mp4')


def avi_codec(head: bytes) -> Optional[str]:
    """The codec an AVI header names (its video stream's ``strh``), read
    here for a file OpenCV would not open."""
    at = head.find(b'strh')
    if at < 0 or head[at + 8:at + 12] != b'vids':
        return None
    return printable(int.from_bytes(head[at + 12:at + 16], 'little'))


def printable(fourcc: int) -> Optional[str]:
    """A FOURCC code as its letters, None unless they are printable ASCII
    (OpenCV states -1, ``'ÿÿÿÿ'``, where it knows none)."""
    letters = (fourcc & 0xFFFFFFFF).to_bytes(4, 'little').rstrip(b'\x00 ')
    if not letters or not all(0x20 <= b < 0x7F for b in letters):
        return None
    return letters.decode('ascii')


def open_live(path: str, timeout: float) -> FrameSource:
    """A camera or a stream, opened and its first frame read (then
    released: :meth:`FrameSource.live_frames` opens it again when the
    model is ready, so that no frame waits meanwhile)."""
    import cv2
    kind = 'camera' if path.isdigit() else 'stream'
    capture = open_capture(path, timeout)
    try:
        asked = time.monotonic()
        if not capture.read()[0]:
            waited = time.monotonic() - asked
            within = f' within {timeout:g} s' if waited >= 0.9 * timeout \
                else ''
            raise ValueError(f'{path}: the {kind} opens but gave no frame'
                             f'{within}')
        fps = float(capture.get(cv2.CAP_PROP_FPS) or 0)
    finally:
        capture.release()
    return FrameSource(kind, path, [], 0, fps if fps > 0 else None,
                       order='as it arrives, the newest frame when the '
                       'model is ready', live=True, timeout=timeout)


def open_capture(path: str, timeout: float):
    """An opened ``cv2.VideoCapture`` of a camera index or stream URL,
    opening and each read bounded by ``timeout`` where the backend takes
    the bound (FFmpeg does; a camera backend that refuses it is opened
    without); ``ValueError`` naming the input if it does not open."""
    import cv2
    msec = int(timeout * 1000)
    bounds = [cv2.CAP_PROP_OPEN_TIMEOUT_MSEC, msec,
              cv2.CAP_PROP_READ_TIMEOUT_MSEC, msec]
    asked = time.monotonic()
    if path.isdigit():
        capture = cv2.VideoCapture(int(path), cv2.CAP_ANY, bounds)
        if not capture.isOpened():
            capture = cv2.VideoCapture(int(path))
        if capture.isOpened():
            return capture
        raise ValueError(f'{path}: camera index {path} is not available '
                         '(OpenCV opens no camera there)')
    capture = cv2.VideoCapture(path, cv2.CAP_FFMPEG, bounds)
    if capture.isOpened():
        return capture
    waited = time.monotonic() - asked
    why = f'nothing answered within {timeout:g} s' if waited >= 0.9 * \
        timeout else ('refused, not found, or not a video OpenCV\'s FFmpeg '
                      'reads')
    raise ValueError(f'{path}: the stream URL cannot be opened ({why})')
