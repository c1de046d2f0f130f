"""The IoU areas by ``scatter_add_``: exactly MMSeg's ``histc`` areas, no
``histc`` (which raises on CUDA in deterministic mode) and no op that reads
the device (a boolean mask, ``bincount``)."""
import numpy as np
import pytest
import torch
from mmseg.evaluation.metrics import IoUMetric
from torch.utils._python_dispatch import TorchDispatchMode

from mmseg_stag.segmentation.evaluation.continual_metric import (
    ContinualIoUMetric, intersect_and_union)


class OpNames(TorchDispatchMode):
    """Records the aten op (overload packet) names called inside it."""

    def __init__(self):
        super().__init__()
        self.names = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.add(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))


def mmseg_areas(pred, label, num_classes, ignore_index):
    """MMSeg's own ``[4, C]`` areas, float64."""
    return torch.stack(IoUMetric.intersect_and_union(
        pred, label, num_classes, ignore_index)).double()


def random_maps(seed, shape, num_classes, ignore_index=255):
    """Prediction and label maps with ignore pixels, labels and predictions
    outside ``[0, C)`` (which no class counts) and an absent class."""
    g = torch.Generator().manual_seed(seed)
    pred = torch.randint(0, num_classes, shape, generator=g)
    label = torch.where(torch.rand(shape, generator=g) < 0.7, pred,
                        torch.randint(0, num_classes, shape, generator=g))
    label[torch.rand(shape, generator=g) < 0.15] = ignore_index
    label[torch.rand(shape, generator=g) < 0.02] = num_classes + 3
    pred[torch.rand(shape, generator=g) < 0.02] = num_classes
    label[label == 1] = 2  # class 1 never in the labels
    return pred, label


@pytest.mark.parametrize('seed', range(4))
@pytest.mark.parametrize('num_classes,shape', [(19, (48, 96)),
                                               (5, (7, 9)), (2, (1, 30))])
def test_areas_equal_mmseg_intersect_and_union(seed, num_classes, shape):
    pred, label = random_maps(seed, shape, num_classes)
    ours = intersect_and_union(pred, label, num_classes, 255)
    assert ours.shape == (4, num_classes) and ours.dtype == torch.int64
    assert torch.equal(ours.double(),
                       mmseg_areas(pred, label, num_classes, 255))


@pytest.mark.parametrize('ignore_index', [255, 0, -1])
def test_ignore_index_and_all_ignored(ignore_index):
    pred, label = random_maps(7, (20, 20), 19, ignore_index)
    assert torch.equal(intersect_and_union(pred, label, 19,
                                           ignore_index).double(),
                       mmseg_areas(pred, label, 19, ignore_index))
    label = torch.full_like(label, ignore_index)
    areas = intersect_and_union(pred, label, 19, ignore_index)
    assert not areas.any()
    assert torch.equal(areas.double(), mmseg_areas(pred, label, 19,
                                                   ignore_index))


def test_no_histc_and_no_read_in_deterministic_mode():
    """On CUDA ``histc`` raises under ``use_deterministic_algorithms(True)``
    (MMSeg's function calls it); the metric's record calls ``scatter_add_``
    (deterministic on CUDA in that mode) and nothing that waits for the
    device."""
    from host_syncs import HostSyncCounter
    pred, label = random_maps(0, (12, 16), 19)
    sample = dict(pred_sem_seg=dict(data=pred[None]),
                  gt_sem_seg=dict(data=label[None].to(torch.uint8)),
                  img_path='x.png')
    metric = ContinualIoUMetric()
    was = (torch.are_deterministic_algorithms_enabled(),
           torch.is_deterministic_algorithms_warn_only_enabled())
    torch.use_deterministic_algorithms(True)
    try:
        with OpNames() as ours, HostSyncCounter() as syncs:
            record = metric.image_record(sample)
        with OpNames() as old:
            mmseg_areas(pred, label.to(torch.uint8).long(), 19, 255)
    finally:
        torch.use_deterministic_algorithms(was[0], warn_only=was[1])
    assert 'histc' not in ours.names and 'scatter_add_' in ours.names
    assert 'histc' in old.names
    assert syncs.calls == []
    np.testing.assert_array_equal(
        record['areas'].numpy(),
        mmseg_areas(pred, label.long(), 19, 255).numpy())
