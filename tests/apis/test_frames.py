"""``open_frames``: a list checked line by line before any work; a video
that cannot be read told apart (empty, no video, damaged, a codec OpenCV
cannot decode) and one decoding short of its stated count told at its
end; a camera or stream read live, the newest frame each time one is
taken, on an MJPEG stream this test serves itself."""
import socket
import threading
import time

import cv2
import numpy as np
import pytest
from stream_helpers import LEVEL, SIZE, frame

from mmseg_stag.apis import FrameSource, open_frames


def number_of(image):
    return int(round(float(image.mean()) / LEVEL))


def write_video(path, fourcc, frames=30):
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*fourcc), 10,
                             SIZE)
    assert writer.isOpened(), fourcc
    for number in range(frames):
        writer.write(frame(number))
    writer.release()
    return str(path)


def cut(path, fraction, out):
    """The first ``fraction`` of a file: a copy cut short."""
    data = open(path, 'rb').read()
    out.write_bytes(data[:int(len(data) * fraction)])
    return str(out)


# ----------------------------------------------------------------- lists
def test_a_list_is_read_in_its_order_comments_and_blanks_skipped(tmp_path):
    for name in ('b.png', 'a.jpg'):
        cv2.imwrite(str(tmp_path / name), frame(1))
    (tmp_path / 'frames.txt').write_text('# two frames\nb.png\n\n  a.jpg \n')
    source = open_frames(str(tmp_path / 'frames.txt'))
    assert source.kind == 'list' and source.count == 2
    assert source.files == [str(tmp_path / 'b.png'), str(tmp_path / 'a.jpg')]


def test_a_list_of_prose_is_refused_naming_its_first_line(tmp_path):
    cv2.imwrite(str(tmp_path / 'a.png'), frame(1))
    notes = tmp_path / 'notes.txt'
    notes.write_text('# my run\na.png\nThe frames were taken at dusk.\n')
    with pytest.raises(ValueError, match=f'^{notes}, line 3: \'The frames '
                       'were taken at dusk.\' is not an image file'):
        open_frames(str(notes))
    (tmp_path / 'videos.lst').write_text('clip.mp4\n')
    with pytest.raises(ValueError, match=r'videos.lst, line 1: .clip.mp4. '
                       'is not an image file'):
        open_frames(str(tmp_path / 'videos.lst'))


def test_missing_listed_images_are_counted_and_the_first_named(tmp_path):
    cv2.imwrite(str(tmp_path / 'a.png'), frame(1))
    names = ['a.png', 'b.png', 'c.jpg', 'd.jpg', 'e.png']
    (tmp_path / 'frames.txt').write_text('\n'.join(names))
    with pytest.raises(ValueError) as err:
        open_frames(str(tmp_path / 'frames.txt'))
    message = str(err.value)
    assert '4 of the 5 listed images do not exist (line 2: ' \
        f'{tmp_path / "b.png"}, line 3: ' in message
    assert 'e.png' not in message.replace(f'{tmp_path}', '') and \
        message.count('\n') == 0


# ---------------------------------------------------------------- videos
@pytest.mark.parametrize('name,fourcc', [('clip.avi', 'FFV1'),
                                         ('clip.avi', 'MJPG'),
                                         ('clip.mp4', 'mp4v')])
def test_a_video_decodes_its_stated_frames(name, fourcc, tmp_path):
    source = open_frames(write_video(tmp_path / name, fourcc))
    assert (source.kind, source.count, source.fps) == ('video', 30, 10.0)
    assert source.decoded is None and source.ended_early() is None
    numbers = [number_of(image) for _, image in source.video_frames()]
    # mp4v is lossy: a flat level comes back within one step
    assert np.abs(np.subtract(numbers, range(30))).max() <= 1
    assert source.decoded == 30
    assert source.ended_early() is None
    frames = source.video_frames(2)
    assert next(frames)[0] == 2
    frames.close()  # a consumer that stops first learns nothing of the end
    assert source.decoded is None and source.ended_early() is None


@pytest.mark.parametrize('fourcc', ['FFV1', 'MJPG'])
def test_an_avi_cut_short_decodes_in_part_and_says_so_at_its_end(
        fourcc, tmp_path):
    """OpenCV opens an AVI cut at 90 % with its header's count (30) and
    decodes the frames that are whole; cut at 10 %, it opens none."""
    whole = write_video(tmp_path / 'clip.avi', fourcc)
    source = open_frames(cut(whole, 0.9, tmp_path / 'cut.avi'))
    assert source.count == 30
    numbers = [number_of(image) for _, image in source.video_frames()]
    assert 0 < source.decoded < 30 and numbers == list(range(source.decoded))
    assert source.ended_early() == (
        f'decoding ended after {source.decoded} of the 30 frames its '
        'container states: the file is cut short or damaged from frame '
        f'{source.decoded} on')
    head = cut(whole, 0.1, tmp_path / 'head.avi')
    with pytest.raises(ValueError, match=r'head.avi: OpenCV cannot open '
                       r'this AVI file \(\d+ bytes, codec .(FFV1|MJPG).\): '
                       'it is cut short or damaged'):
        open_frames(head)


def test_an_mp4_cut_short_is_refused_as_a_damaged_mp4(tmp_path):
    """An MP4 written by OpenCV has its index at the end: cut, it opens
    not at all (FFmpeg: 'moov atom not found')."""
    whole = write_video(tmp_path / 'clip.mp4', 'mp4v')
    with pytest.raises(ValueError, match=r'cut.mp4: OpenCV cannot open this '
                       r'MP4/MOV file \(\d+ bytes\): it is cut short or '
                       'damaged.*lacks its index'):
        open_frames(cut(whole, 0.9, tmp_path / 'cut.mp4'))


def test_an_empty_file_and_a_text_named_mp4_are_not_videos(tmp_path):
    (tmp_path / 'empty.mp4').write_bytes(b'')
    with pytest.raises(ValueError, match=r'empty.mp4: the file is empty '
                       r'\(0 bytes\), not a video$'):
        open_frames(str(tmp_path / 'empty.mp4'))
    (tmp_path / 'text.mp4').write_text('not a video at all' * 100)
    with pytest.raises(ValueError) as err:
        open_frames(str(tmp_path / 'text.mp4'))
    assert str(err.value) == (
        f'{tmp_path / "text.mp4"}: not a video container OpenCV can open '
        "(1800 bytes, beginning as text: 'not a video at allnot a video at "
        "allnot')")


def test_a_codec_opencv_cannot_decode_is_named_only_if_printable(tmp_path):
    """An MJPEG AVI relabelled: as HEVC it opens and its first frame fails
    (the codec named, the conversion hint); as a codec FFmpeg does not
    know it does not open (the AVI header's codec named); as bytes that
    are no letters, no codec is printed."""
    data = open(write_video(tmp_path / 'clip.avi', 'MJPG'), 'rb').read()
    (tmp_path / 'hevc.avi').write_bytes(data.replace(b'MJPG', b'HEVC'))
    with pytest.raises(ValueError, match=r"hevc.avi: OpenCV cannot decode "
                       r"this video \(codec '(?i:hevc)'\): its container "
                       'opens but its first frame does not decode; convert '
                       'it, e.g. ffmpeg -i INPUT -c:v libx264 out.mp4'):
        open_frames(str(tmp_path / 'hevc.avi'))
    (tmp_path / 'xxxx.avi').write_bytes(data.replace(b'MJPG', b'XXXX'))
    with pytest.raises(ValueError, match=r"xxxx.avi: OpenCV cannot open this "
                       r"AVI file \(\d+ bytes, codec 'XXXX'\)"):
        open_frames(str(tmp_path / 'xxxx.avi'))
    (tmp_path / 'bytes.avi').write_bytes(data.replace(b'MJPG',
                                                      b'\x01\xff\x03\x04'))
    with pytest.raises(ValueError, match=r'bytes.avi: OpenCV cannot open this'
                       r' AVI file \(\d+ bytes\): ') as err:
        open_frames(str(tmp_path / 'bytes.avi'))
    assert 'codec \'' not in str(err.value) and '\xff' not in str(err.value)


# ------------------------------------------------------------ live inputs
def readers():
    return [t for t in threading.enumerate()
            if t.name == 'frames-live-reader' and t.is_alive()]


def wait_closed(feed, seconds=3.0):
    deadline = time.monotonic() + seconds
    while feed.active and time.monotonic() < deadline:
        time.sleep(0.02)
    return feed.active == 0


def test_a_stream_is_live_and_read_in_order_to_its_end(serve):
    url, feed = serve()
    source = open_frames(url)
    assert (source.kind, source.live, source.count) == ('stream', True, 0)
    assert source.fps is None or source.fps > 0
    taken = [(index, number_of(image))
             for index, image in source.live_frames()]
    indices, numbers = zip(*taken)
    assert list(indices) == list(range(len(taken)))
    assert list(numbers) == source.frame_numbers == sorted(set(numbers))
    assert len(taken) + source.dropped == 45 and len(taken) >= 40
    assert source.ended_early() is None  # the server closed: its end
    assert source.name(3) == f'{url}#3' and source.seconds(0) == 0.0
    assert 1.0 < source.seconds(len(taken) - 1) < 3.0
    assert not readers() and wait_closed(feed)


def test_a_slow_consumer_takes_the_newest_frame_and_counts_the_rest(serve):
    url, feed = serve(frames=45, fps=30)
    source = open_frames(url)
    taken = []
    for index, image in source.live_frames():
        taken.append((time.monotonic(), number_of(image)))
        time.sleep(0.15)  # a model slower than the stream
    numbers = [n for _, n in taken]
    assert numbers == source.frame_numbers and numbers == sorted(set(numbers))
    gaps = sum(b - a - 1 for a, b in zip([-1] + numbers, numbers))
    assert source.dropped == gaps > 20
    sent = feed.sent[-1]
    # how far each taken frame is behind the newest sent: a queue's lag
    # grows frame by frame; the newest-frame reader's stays small (the
    # median: a loaded machine can delay the reader thread now and then)
    lags = sorted(max(n for n, t in enumerate(sent) if t <= at) - number
                  for at, number in taken[1:])
    assert lags[len(lags) // 2] <= 2, lags
    note = source.dropped_note()
    assert note.startswith(f'{source.dropped} frames dropped, a newer one '
                           'arriving before the model took them (capture '
                           'frames ')
    assert note.endswith(f'); {len(numbers)} taken')
    assert not readers() and wait_closed(feed)


class Capture:
    """A capture of ``frames`` frames, each read at once."""

    def __init__(self, frames):
        self.frames, self.read_count = frames, 0

    def read(self):
        if self.read_count == self.frames:
            return False, None
        self.read_count += 1
        return True, frame(self.read_count - 1)

    def get(self, prop):
        return 25.0

    def release(self):
        pass


def test_drops_before_the_first_take_are_counted(monkeypatch):
    """The reader thread may read (and drop) frames before the consumer's
    thread runs again: the count starts before the thread, not after (a
    loaded CI machine lost one so)."""
    from mmseg_stag.apis import frames as frames_module

    class SlowToReturn(frames_module.LiveReader):
        def __init__(self, *args):
            super().__init__(*args)
            while self.read < 2:  # the thread reads two before we go on
                time.sleep(0.001)

    monkeypatch.setattr(frames_module, 'LiveReader', SlowToReturn)
    monkeypatch.setattr(frames_module, 'open_capture',
                        lambda path, timeout: Capture(5))
    source = open_frames('http://127.0.0.1:9/stream')  # never dialled
    taken = [number_of(image) for _, image in source.live_frames()]
    assert taken[0] >= 1 and taken == source.frame_numbers
    assert source.dropped == 5 - len(taken)


def test_stopping_ends_the_thread_and_closes_the_connection(serve):
    url, feed = serve(frames=300)
    source = open_frames(url)
    assert [i for i, _ in source.live_frames(stop=5)] == [0, 1, 2, 3, 4]
    assert not readers() and wait_closed(feed)
    frames = source.live_frames()
    next(frames)
    assert readers()
    frames.close()
    assert not readers() and wait_closed(feed)
    assert source.ended_early() is None


def test_a_stalled_stream_ends_at_the_read_timeout_and_says_so(serve):
    url, feed = serve(frames=5, stall=30)
    source = open_frames(url, timeout=1.0)
    started = time.monotonic()
    taken = [i for i, _ in source.live_frames()]
    assert 0 < len(taken) <= 5 and time.monotonic() - started < 6
    assert source.ended_early() == ('no frame came for 1 s (the read '
                                    'timeout) after 5 frames: the input '
                                    'stalled')
    assert not readers()


def test_a_url_or_camera_that_does_not_open_is_one_sentence(serve):
    url, _ = serve()
    with pytest.raises(ValueError, match=r'/nothing: the stream URL cannot be'
                       r' opened \(refused, not found'):
        open_frames(url.replace('/stream', '/nothing'))
    with socket.socket() as free:
        free.bind(('127.0.0.1', 0))
        port = free.getsockname()[1]
    with pytest.raises(ValueError, match=f'^rtsp://127.0.0.1:{port}/live: '
                       'the stream URL cannot be opened'):
        open_frames(f'rtsp://127.0.0.1:{port}/live', timeout=2.0)
    started = time.monotonic()
    with pytest.raises(ValueError, match=r'^97: camera index 97 is not '
                       r'available \(OpenCV opens no camera there\)$'):
        open_frames('97')
    assert time.monotonic() - started < 5


def test_a_live_input_has_no_past_to_resume_from(serve):
    url, _ = serve()
    with pytest.raises(ValueError, match='cannot start at frame 3'):
        next(open_frames(url).video_frames(3))


def test_the_dropped_note_names_the_runs_of_frames_not_taken():
    source = FrameSource('stream', 'http://host/s', live=True, dropped=6,
                         frame_numbers=[2, 3, 5, 9])
    assert source.dropped_note() == (
        '6 frames dropped, a newer one arriving before the model took them '
        '(capture frames 0-1, 4, 6-8); 4 taken')
    assert source.dropped_note(shown=1).endswith('(capture frames 0-1, ...)'
                                                 '; 4 taken')
    assert FrameSource('stream', 'u', live=True).dropped_note() is None
