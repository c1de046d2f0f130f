from .scenes import (CONDITIONS, apply_condition, make_demo_benchmark,
                     render_scene, write_acdc_like, write_cityscapes_like)

__all__ = [
    'CONDITIONS', 'apply_condition', 'make_demo_benchmark', 'render_scene',
    'write_acdc_like', 'write_cityscapes_like'
]
