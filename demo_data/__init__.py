"""Generators of the offline demos' stand-in data and source models.

Not part of the installed package: ``tools/demo.py``, ``tools/demo_cls.py``,
``tools/make_demo_data.py`` and the tests import them from the repository.
"""
from .acdc_layout import acdc_paths, make_acdc_like_tree, save_png
from .scenes import (CONDITIONS, apply_condition, make_demo_benchmark,
                     render_scene, write_acdc_like, write_cityscapes_like)

__all__ = [
    'CONDITIONS', 'apply_condition', 'make_demo_benchmark', 'render_scene',
    'write_acdc_like', 'write_cityscapes_like', 'acdc_paths',
    'make_acdc_like_tree', 'save_png'
]
