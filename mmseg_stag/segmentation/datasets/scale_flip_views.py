"""``ScaleFlipViews``: the scaled and flipped views of an image that CoTTA's
teacher averages (CoTTA's ``tools/cotta.py``: ``MultiScaleFlipAug`` with
``img_ratios`` 0.5 ... 2.0 and ``flip=True``)."""
from typing import List, Sequence, Tuple

from mmcv.transforms import TestTimeAug
from mmseg.registry import TRANSFORMS


@TRANSFORMS.register_module()
class ScaleFlipViews(TestTimeAug):
    """One view per (ratio, flip): ``Resize(scale * ratio, keep_ratio=True)``
    of the loaded image, unflipped and flipped, then ``transforms``.

    Views come ratio by ratio, the unflipped one first, as in MMSeg 0.x's
    ``MultiScaleFlipAug``: the unflipped view at ratio 1 is
    :attr:`main_view` (CoTTA's ``img_id = 4``).

    Args:
        scale (tuple[int, int]): ``(w, h)`` of ratio 1 (CoTTA: 960x540).
        ratios (Sequence[float]): must contain 1.0. Default: CoTTA's
            ``(0.5, 0.75, 1.0, 1.25, 1.5, 1.75, 2.0)``.
        flip (bool): add the horizontally flipped view of each ratio.
            Default: True.
        transforms (list[dict]): applied to every view after the resize and
            flip (e.g. ``LoadAnnotations``, ``PackSegInputs``).
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
