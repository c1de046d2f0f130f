"""mIoU per stage of a continual segmentation stream."""
from typing import List, Optional, Sequence

import numpy as np
import torch
from mmseg.datasets import CityscapesDataset
from mmseg.registry import METRICS

from mmseg_stag.engine.report import mean_ignoring_nan
from mmseg_stag.engine.stream_metric import StreamMetric


def intersect_and_union(pred: torch.Tensor, label: torch.Tensor,
                        num_classes: int,
                        ignore_index: int) -> torch.Tensor:
    """Return an image's int64 ``[4, C]`` areas: intersect, union, pred,
    label.

    The numbers of MMSeg's ``IoUMetric.intersect_and_union`` (pixels whose
    label is ``ignore_index`` dropped, values outside ``[0, C)`` counted in
    no class), from one ``scatter_add_`` of the confusion matrix instead
    of ``torch.histc``: exact integer counts, deterministic on CUDA (where
    ``histc`` raises in deterministic mode), and no read of the device: an
    ignored pixel is counted in a bin of its own rather than masked out (a
    boolean mask's size, like ``bincount``'s length, is read back from the
    device), so a GPU run scores an image without waiting for it.
    """
    other = num_classes  # one extra bin for values outside the classes
    size = num_classes + 1
    pred, label = pred.long(), label.long()
    pred = torch.where((pred >= 0) & (pred < num_classes), pred, other)
    known = torch.where((label >= 0) & (label < num_classes), label, other)
    # the ignored pixels' bin: past the (C+1) x (C+1) matrix, dropped
    index = torch.where(label != ignore_index, known * size + pred,
                        size * size).flatten()
    counts = torch.zeros(size * size + 1, dtype=torch.long,
                         device=index.device)
    counts.scatter_add_(0, index, torch.ones_like(index))
    confusion = counts[:size * size].reshape(size, size)
    area_intersect = confusion.diagonal()[:num_classes]
    area_pred = confusion.sum(dim=0)[:num_classes]
    area_label = confusion.sum(dim=1)[:num_classes]
    return torch.stack([area_intersect,
                        area_pred + area_label - area_intersect, area_pred,
                        area_label])


def stage_miou(areas: np.ndarray, class_names: Sequence[str]):
    """Return a stage's mIoU and per-class IoU (%) from its summed
    ``[4, C]`` areas; a class absent from label and prediction gets NaN,
    as in MMSeg."""
    intersect, union = areas[0], areas[1]
    with np.errstate(divide='ignore', invalid='ignore'):
        iou = np.where(union > 0, intersect / union, np.nan) * 100
    return mean_ignoring_nan(iou.tolist()), {
        c: None if np.isnan(v) else float(v)
        for c, v in zip(class_names, iou)}


@METRICS.register_module()
class ContinualIoUMetric(StreamMetric):
    """mIoU per stage of a continual stream, from areas summed per stage.

    Args:
        ignore_index (int): Label ignored by the metric. Default: 255.
        output_dir (str, optional): Where results are written (the online
            loop sets the work dir). Default: None.
        collect_device, prefix: See ``BaseMetric``.
        keep_results (bool): Only ``True``, what ``tools/test.py --out``
            (ours and MMSeg's own) sets beside ``output_dir``: the results
            are always kept (written to ``output_dir``). Default: True.

    Raises:
        TypeError: If an unknown argument is given.
        ValueError: If ``keep_results`` is not True (nothing here deletes
            the results).
    """

    default_prefix = 'continual'
    score_name = 'mIoU'
    task = 'segmentation'

    def __init__(self,
                 ignore_index: int = 255,
                 output_dir: Optional[str] = None,
                 collect_device: str = 'cpu',
                 prefix: Optional[str] = None,
                 keep_results: bool = True,
                 **kwargs):
        if kwargs:
            raise TypeError(f'ContinualIoUMetric: unknown arguments '
                            f'{sorted(kwargs)}')
        super().__init__(output_dir, collect_device, prefix, keep_results)
        self.ignore_index = ignore_index

    @property
    def class_names(self) -> List[str]:
        """Class names of the dataset, else Cityscapes' 19."""
        meta = self.dataset_meta or {}
        return list(meta.get('classes', CityscapesDataset.METAINFO['classes']))

    def image_record(self, sample: dict) -> dict:
        """Return the image's ``[4, C]`` areas (:func:`intersect_and_union`,
        float64, on the prediction's device).

        Raises:
            KeyError: If the prediction or label is missing.
            ValueError: If they differ in size.
        """
        missing = [k for k in ('pred_sem_seg', 'gt_sem_seg')
                   if k not in sample]
        if missing:
            raise KeyError(f'ContinualIoUMetric: sample '
                           f'{sample.get("img_path")} has no {missing}')
        pred = sample['pred_sem_seg']['data'].squeeze()
        # the loop copied the label with the batch; else without a wait
        label = sample['gt_sem_seg']['data'].squeeze().to(
            pred.device, non_blocking=True)
        if pred.shape != label.shape:
            raise ValueError(
                f'ContinualIoUMetric: prediction {tuple(pred.shape)} and '
                f'label {tuple(label.shape)} of {sample.get("img_path")} '
                'differ in size; predictions must be at the original '
                'image size')
        areas = intersect_and_union(pred, label, len(self.class_names),
                                    self.ignore_index)
        # on the prediction's device until the stage's end reads them all
        # (StreamMetric.read_records): no wait for the GPU per image
        return dict(areas=areas.double())

    def stage_score(self, records: List[dict]):
        """Return the mIoU of the stage's summed areas, per-class IoU as
        its details."""
        miou, per_class = stage_miou(
            np.sum([r['areas'] for r in records], axis=0), self.class_names)
        return miou, dict(per_class_IoU=per_class)

    def csv_detail(self):
        return 'per_class_IoU', self.class_names
