"""The scaled and flipped views of an image that CoTTA's teacher averages.

Follows ``MultiScaleFlipAug`` in CoTTA's ACDC code, ``tools/cotta.py``.
"""
from typing import List, Sequence, Tuple

from mmcv.transforms import TestTimeAug
from mmseg.registry import TRANSFORMS


@TRANSFORMS.register_module()
class ScaleFlipViews(TestTimeAug):
    """Test-time augmentation with one view per ratio and flip.

    Args:
        scale (tuple[int, int]): ``(w, h)`` at ratio 1.
        ratios (Sequence[float]): Resize ratios, containing 1.0.
            Default: (0.5, 0.75, 1.0, 1.25, 1.5, 1.75, 2.0).
        flip (bool): Whether to add each ratio's flipped view.
            Default: True.
        transforms (list[dict]): Applied to every view after the resize
            and flip. Default: ().

    Raises:
        ValueError: If ``ratios`` lacks 1.0.
    """

    def __init__(self,
                 scale: Tuple[int, int],
                 ratios: Sequence[float] = (0.5, 0.75, 1.0, 1.25, 1.5, 1.75,
                                            2.0),
                 flip: bool = True,
                 transforms: List[dict] = ()):
        ratios = [float(r) for r in ratios]
        if 1.0 not in ratios:
            raise ValueError(f'ScaleFlipViews: ratios {ratios} must contain '
                             '1.0 (the view the model adapts on)')
        w, h = scale
        resizes = [dict(type='Resize', scale=(int(w * r), int(h * r)),
                        keep_ratio=True) for r in ratios]
        flips = [dict(type='RandomFlip', prob=0., direction='horizontal')]
        if flip:
            flips.append(
                dict(type='RandomFlip', prob=1., direction='horizontal'))
        super().__init__([resizes, flips] + [[t] for t in transforms])
        self.main_view = ratios.index(1.0) * len(flips)
        self.num_views = len(ratios) * len(flips)
