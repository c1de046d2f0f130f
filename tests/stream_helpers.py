"""An MJPEG stream served on 127.0.0.1, as IP cameras serve: the live
input of ``tests/apis/test_frames.py`` and ``tests/tools/test_adapt_run.py``
(each frame a flat grey level, its number times ``LEVEL``)."""
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import cv2
import numpy as np
import pytest

#: a flat grey level a frame: its number times this (JPEG keeps it)
LEVEL = 5
SIZE = (64, 48)


def frame(number, size=SIZE):
    return np.full((size[1], size[0], 3), number * LEVEL % 256, np.uint8)


class Feed:
    """What the MJPEG server sends: ``frames`` frames at ``fps``, then
    holding the connection ``stall`` seconds before closing it; when each
    connection sent each frame, and how many are open."""

    def __init__(self, frames, fps, stall, size=SIZE):
        self.frames, self.fps, self.stall = frames, fps, stall
        self.size = size
        self.sent, self.active = [], 0
        self.release = threading.Event()


class MJPEG(BaseHTTPRequestHandler):
    """``/stream``: an MJPEG multipart stream, as IP cameras serve."""

    def log_message(self, *args):
        pass

    def do_GET(self):
        feed = self.server.feed
        if self.path != '/stream':
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header('Content-Type',
                         'multipart/x-mixed-replace; boundary=frame')
        self.end_headers()
        sent = []
        feed.sent.append(sent)
        feed.active += 1
        try:
            for number in range(feed.frames):
                image = frame(number, feed.size)
                jpeg = cv2.imencode('.jpg', image)[1].tobytes()
                self.wfile.write(
                    b'--frame\r\nContent-Type: image/jpeg\r\nContent-Length:'
                    b' %d\r\n\r\n%s\r\n' % (len(jpeg), jpeg))
                self.wfile.flush()
                sent.append(time.monotonic())
                time.sleep(1 / feed.fps)
            feed.release.wait(feed.stall)
        except (BrokenPipeError, ConnectionResetError):
            pass
        finally:
            feed.active -= 1


@pytest.fixture
def serve():
    """``serve(frames, fps, stall)``: the URL of a stream served on
    127.0.0.1 (a free port), and its :class:`Feed`."""
    servers = []

    def start(frames=45, fps=30, stall=0.0, size=SIZE):
        server = ThreadingHTTPServer(('127.0.0.1', 0), MJPEG)
        server.daemon_threads, server.block_on_close = True, False
        server.feed = Feed(frames, fps, stall, size)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f'http://127.0.0.1:{server.server_port}/stream', server.feed

    yield start
    for server in servers:
        server.feed.release.set()
        server.shutdown()
        server.server_close()


