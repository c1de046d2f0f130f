"""Adapting on a user's own frames: :class:`OnlineInferencer` (one call a
frame) and the frame sources of ``tools/adapt.py`` (image folders and
lists, videos, cameras and streams)."""
from .frames import FrameSource, open_frames
from .online_inferencer import OnlineInferencer

__all__ = ['FrameSource', 'OnlineInferencer', 'open_frames']
