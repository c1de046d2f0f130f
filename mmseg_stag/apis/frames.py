"""Where a user's frames come from: an image folder (sorted by path), a
text file listing images, or a video file; each frame read as the
config's pipeline reads it, a bad one named rather than fatal."""
import os
import os.path as osp
from dataclasses import dataclass, field
from typing import Iterator, List, Optional, Tuple

import numpy as np

IMAGE_SUFFIXES = ('.png', '.jpg', '.jpeg', '.bmp', '.tif', '.tiff', '.webp',
                  '.ppm', '.pgm', '.pbm')
VIDEO_SUFFIXES = ('.mp4', '.avi', '.mov', '.mkv', '.webm', '.m4v', '.mpg',
                  '.mpeg', '.wmv', '.ts')
#: a list file: one image a line, relative to the list's folder
LIST_SUFFIXES = ('.txt', '.lst')


@dataclass
class FrameSource:
    """The frames of one input, in stream order.

    ``kind``: ``folder``, ``list`` or ``video``; ``files``: the images of a
    folder or list (none for a video); ``count``: the frames (a video's,
    as its container states it); ``fps``: a video's frame rate; ``order``:
    how the order was chosen, for the log."""
    kind: str
    path: str
    files: List[str] = field(default_factory=list)
    count: int = 0
    fps: Optional[float] = None
    order: str = ''

    def name(self, index: int) -> str:
        """How a frame is named in logs and the CSV."""
        if self.kind == 'video':
            return f'{self.path}#{index}'
        return self.files[index]

    def seconds(self, index: int) -> Optional[float]:
        """A video frame's time in the video (None for images)."""
        return index / self.fps if self.kind == 'video' and self.fps else None

    def video_frames(self, start: int = 0
                     ) -> Iterator[Tuple[int, Optional[np.ndarray]]]:
        """``(index, BGR uint8 frame)`` of a video from ``start`` on, as
        OpenCV decodes it (the frames before ``start`` decoded and
        dropped: a codec seeks to key frames only)."""
        import cv2
        capture = cv2.VideoCapture(self.path)
        try:
            index = 0
            while True:
                ok, frame = capture.read()
                if not ok:
                    return
                if index >= start:
                    yield index, frame
                index += 1
        finally:
            capture.release()


def open_frames(path: str) -> FrameSource:
    """The frames of ``path``: a folder of images (every image under it,
    sorted by path), a text file listing images (its order; blank lines
    and ``#`` comments skipped; paths relative to the list's folder), or
    a video file.

    Raises:
        FileNotFoundError: If ``path`` does not exist.
        ValueError: If it holds no frame, its kind is unknown, or OpenCV
            cannot decode the video (its codec), in one sentence.
    """
    if not osp.exists(path):
        raise FileNotFoundError(f'input not found: {path}')
    if osp.isdir(path):
        files = sorted(
            osp.join(root, name) for root, _, names in os.walk(path)
            for name in names if name.lower().endswith(IMAGE_SUFFIXES))
        if not files:
            raise ValueError(f'{path}: no image in this folder (looked for '
                             f'{", ".join(IMAGE_SUFFIXES)}, sub-folders '
                             'included)')
        return FrameSource('folder', path, files, len(files),
                           order='sorted by path')
    lower = path.lower()
    if lower.endswith(LIST_SUFFIXES):
        base = osp.dirname(osp.abspath(path))
        with open(path, encoding='utf-8') as f:
            lines = [line.strip() for line in f]
        files = [line if osp.isabs(line) else osp.join(base, line)
                 for line in lines if line and not line.startswith('#')]
        if not files:
            raise ValueError(f'{path}: the list names no image')
        return FrameSource('list', path, files, len(files),
                           order='as listed')
    if lower.endswith(VIDEO_SUFFIXES):
        return open_video(path)
    raise ValueError(f'{path}: not a folder, a list ({", ".join(LIST_SUFFIXES)}'
                     f') or a video ({", ".join(VIDEO_SUFFIXES)})')


def open_video(path: str) -> FrameSource:
    """A video's frame count and rate, its first frame decoded to prove
    the codec (``ValueError`` naming the codec otherwise)."""
    import cv2
    capture = cv2.VideoCapture(path)
    try:
        ok = capture.isOpened() and capture.read()[0]
        fourcc = int(capture.get(cv2.CAP_PROP_FOURCC) or 0)
        codec = ''.join(chr((fourcc >> 8 * i) & 0xFF)
                        for i in range(4)).strip('\x00 ') or 'unknown'
        if not ok:
            raise ValueError(
                f'{path}: OpenCV cannot decode this video (codec {codec!r});'
                ' convert it, e.g. ffmpeg -i INPUT -c:v libx264 out.mp4, or '
                'extract its frames to a folder')
        count = int(capture.get(cv2.CAP_PROP_FRAME_COUNT) or 0)
        fps = float(capture.get(cv2.CAP_PROP_FPS) or 0) or None
    finally:
        capture.release()
    return FrameSource('video', path, [], count, fps,
                       order='the video\'s frame order')
