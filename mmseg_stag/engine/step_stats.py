"""The methods' per-step statistics, read from the device in batches and
checked (:class:`~mmseg_stag.core.NonFiniteStatistic` stops the run)."""
import math
from typing import Dict, List, NamedTuple, Optional, Sequence

import torch

from mmseg_stag.core import NonFiniteStatistic, StepStats


class PendingStep(NamedTuple):
    """One step's statistics, kept as they come until the next read."""
    batch: int
    stats: StepStats
    #: the batch's images (their paths, or what the stream names them by)
    images: Optional[Sequence[str]] = None


#: the statistics of the steps since the last read, in batch order (the
#: loop's list)
Pending = List[PendingStep]


def read_step_stats(pending: Pending) -> List[Dict[str, float]]:
    """Every pending step's logged values as floats, read in one transfer
    per device (reading each 0-d tensor, ``.item()``, would drain the GPU
    queue)."""
    logged = [step.stats.logged() for step in pending]
    tensors = [v.detach().reshape(()) for values in logged
               for v in values.values() if torch.is_tensor(v)]
    by_device: Dict[torch.device, List[int]] = {}
    for i, t in enumerate(tensors):
        by_device.setdefault(t.device, []).append(i)
    read = [0.0] * len(tensors)
    for positions in by_device.values():  # one transfer per device
        stacked = torch.stack([tensors[i].double() for i in positions])
        for i, value in zip(positions, stacked.tolist()):
            read[i] = value
    floats = iter(read)
    return [{k: next(floats) if torch.is_tensor(v) else float(v)
             for k, v in values.items()} for values in logged]


def log_step_stats(pending: Pending, message_hub,
                   method: Optional[str] = None) -> List[Dict[str, float]]:
    """Check and log the pending statistics under ``test/`` in batch order;
    return them as read (a step's floats, in ``pending``'s order).

    Every value every step logged is checked (the total loss of each pass,
    its terms, the method's own numbers); the first non-finite one, in
    batch order, raises :class:`NonFiniteStatistic` naming ``method``, the
    statistic, the batch and its images, before anything is logged.
    """
    values = read_step_stats(pending)
    for step, read in zip(pending, values):
        for name, value in read.items():
            if not math.isfinite(value):
                raise NonFiniteStatistic(name, value, step.batch, method,
                                         step.images)
    for read in values:
        for key, value in read.items():
            message_hub.update_scalar(f'test/{key}', value)
    return values
