"""The scaled and flipped views of an image that CoTTA's teacher averages:
``MultiScaleFlipAug`` of CoTTA's ACDC code, ``tools/cotta.py``."""
from typing import List, Sequence, Tuple

from mmcv.transforms import TestTimeAug
from mmengine.structures import PixelData
from mmseg.registry import TRANSFORMS

from .compact_labels import label_tensor


@TRANSFORMS.register_module()
class ScaleFlipViews(TestTimeAug):
    """Test-time augmentation with one view per ratio and flip.

    Args:
        scale (tuple[int, int]): ``(w, h)`` at ratio 1.
        ratios (Sequence[float]): Resize ratios, containing 1.0.
        flip (bool): Whether to add each ratio's flipped view.
        transforms (list[dict]): Applied to every view after the resize
            and flip.
        load_label (bool): Run MMSeg's ``LoadAnnotations`` first.

    With ``load_label`` (or a ``LoadAnnotations`` before this transform)
    the label is read once and kept out of the resizes and flips: the main
    view carries it at the original size, as uint8; the other views carry
    none (the metric scores the main view only). A ``LoadAnnotations``
    among ``transforms`` loads it in every view instead, as CoTTA's code.

    Raises:
        ValueError: If ``ratios`` lacks 1.0.
    """

    def __init__(self,
                 scale: Tuple[int, int],
                 ratios: Sequence[float] = (0.5, 0.75, 1.0, 1.25, 1.5, 1.75,
                                            2.0),
                 flip: bool = True,
                 transforms: List[dict] = (),
                 load_label: bool = False):
        ratios = [float(r) for r in ratios]
        if 1.0 not in ratios:
            raise ValueError(f'ScaleFlipViews: ratios {ratios} must contain '
                             '1.0 (the view the model adapts on)')
        w, h = scale
        resizes = [dict(type='Resize', scale=(int(w * r), int(h * r)),
                        keep_ratio=True) for r in ratios]
        flips = [dict(type='RandomFlip', prob=prob, direction='horizontal')
                 for prob in ((0., 1.) if flip else (0., ))]
        super().__init__([resizes, flips] + [[t] for t in transforms])
        self.main_view = ratios.index(1.0) * len(flips)
        self.load_label = TRANSFORMS.build(
            dict(type='LoadAnnotations')) if load_label else None

    def transform(self, results: dict) -> dict:
        """Return the views; a loaded label goes to the main view only.

        Raises:
            ValueError: If a label is loaded but the views are not packed.
        """
        if self.load_label is not None:
            results = self.load_label(results)
        label = results.pop('gt_seg_map', None)
        if label is not None:
            results['seg_fields'] = [f for f in results.get('seg_fields', [])
                                     if f != 'gt_seg_map']
        views = super().transform(results)
        if label is None:
            return views
        if 'data_samples' not in views:
            raise ValueError('ScaleFlipViews: a label loaded before the views '
                             'needs PackSegInputs among its transforms')
        views['data_samples'][self.main_view].gt_sem_seg = PixelData(
            data=label_tensor(label))
        return views
