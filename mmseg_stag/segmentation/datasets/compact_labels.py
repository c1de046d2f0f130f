"""Label maps as uint8 tensors: an eighth of PackSegInputs' int64 bytes."""
import numpy as np
import torch
from mmcv.transforms import BaseTransform
from mmseg.registry import TRANSFORMS


def label_tensor(label: np.ndarray) -> torch.Tensor:
    """A ``[1, H, W]`` label tensor, uint8 when its values fit."""
    label = np.ascontiguousarray(label)
    if label.dtype != np.uint8 and label.size and (
            label.min() >= 0 and label.max() <= 255):
        label = label.astype(np.uint8)
    return torch.from_numpy(label)[None]


@TRANSFORMS.register_module()
class LabelsAsUint8(BaseTransform):
    """Store a packed label map as uint8 when its values fit (0-255).

    ``PackSegInputs`` packs labels as int64: eight times the bytes through
    the loader's workers, pinned memory and the copy to the GPU; class ids
    and the ignore value 255 fit one byte. Put it after ``PackSegInputs``.
    """

    def transform(self, results: dict) -> dict:
        sample = results.get('data_samples')
        if sample is not None and 'gt_sem_seg' in sample:
            data = sample.gt_sem_seg.data
            if data.dtype != torch.uint8 and data.numel() and (
                    int(data.min()) >= 0 and int(data.max()) <= 255):
                sample.gt_sem_seg.data = data.to(torch.uint8)
        return results
