"""The methods' per-step statistics, read from the device in batches (at
the logger's interval without waiting for the GPU, at a stage's end
waiting) and checked (:class:`~mmseg_stag.core.NonFiniteStatistic` stops
the run)."""
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


class StatsRead:
    """A read of pending steps' statistics, started without waiting
    (:func:`start_read`): per device the values stacked into one tensor;
    from a CUDA device copied into pinned host memory (``non_blocking``)
    with an event after the copy, so that :meth:`ready` asks the GPU
    without waiting for it, and :meth:`values` waits only if the copy has
    not arrived yet (a stage's end). From the CPU the values are there at
    once."""

    def __init__(self, pending: Pending):
        self.pending = pending
        self.logged = [step.stats.logged() for step in pending]
        tensors = [v.detach().reshape(()) for values in self.logged
                   for v in values.values() if torch.is_tensor(v)]
        self.size = len(tensors)
        by_device: Dict[torch.device, List[int]] = {}
        for i, t in enumerate(tensors):
            by_device.setdefault(t.device, []).append(i)
        #: per device: the positions, the host copy, the copy's event
        self.copies = []
        for positions in by_device.values():  # one transfer per device
            stacked = torch.stack([tensors[i].double() for i in positions])
            event = None
            if stacked.is_cuda:
                host = torch.empty(stacked.shape, dtype=stacked.dtype,
                                   pin_memory=True)
                host.copy_(stacked, non_blocking=True)
                event = torch.cuda.Event()
                event.record()
            else:
                host = stacked
            self.copies.append((positions, host, event))

    def ready(self) -> bool:
        """Whether every copy has arrived (asks, never waits)."""
        return all(event is None or event.query()
                   for _, _, event in self.copies)

    def values(self) -> List[Dict[str, float]]:
        """Every step's logged values as floats (waits for the copies)."""
        read = [0.0] * self.size
        for positions, host, event in self.copies:
            if event is not None:
                event.synchronize()
            for i, value in zip(positions, host.tolist()):
                read[i] = value
        floats = iter(read)
        return [{k: next(floats) if torch.is_tensor(v) else float(v)
                 for k, v in values.items()} for values in self.logged]


def read_step_stats(pending: Pending) -> List[Dict[str, float]]:
    """Every pending step's logged values as floats, read in one transfer
    per device (reading each 0-d tensor, ``.item()``, would drain the GPU
    queue)."""
    return StatsRead(pending).values()


def log_step_stats(pending, message_hub,
                   method: Optional[str] = None) -> List[Dict[str, float]]:
    """Check and log the pending statistics (or a :class:`StatsRead` of
    them) under ``test/`` in batch order; return them as read (a step's
    floats, in ``pending``'s order).

    Every value every step logged is checked (the total loss of each pass,
    its terms, the method's own numbers); the first non-finite one, in
    batch order, raises :class:`NonFiniteStatistic` naming ``method``, the
    statistic, the batch and its images, before anything is logged.
    """
    if isinstance(pending, StatsRead):  # started earlier: its values
        pending, values = pending.pending, pending.values()
    else:
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
