"""The methods' per-step statistics, read from the device in batches."""
import math
from typing import Dict, List, Tuple

import torch

from mmseg_stag.core import StepStats


class PendingStats:
    """Statistics of the steps since the last read, kept as they come.

    A method returns 0-d tensors where reading a value would wait for the
    device (``.item()`` drains the GPU queue); :meth:`flush` reads all of
    them in one transfer, at the logger's interval.
    """

    def __init__(self):
        self.pending: List[Tuple[int, StepStats]] = []

    def append(self, idx: int, stats: StepStats) -> None:
        """Keep the statistics of batch ``idx``."""
        self.pending.append((idx, stats))

    def read(self) -> List[Tuple[int, Dict[str, float], List[str]]]:
        """Return the pending statistics as ``(batch index, values by
        logged name, the names of its STAG values)`` and forget them."""
        logged = [stats.logged() for _, stats in self.pending]
        tensors = [v.detach().reshape(()) for values in logged
                   for v in values.values() if torch.is_tensor(v)]
        floats = iter(read_tensors(tensors))
        out = [(idx, {k: next(floats) if torch.is_tensor(v) else float(v)
                      for k, v in values.items()},
                [name for name, _ in stats.stag_values()])
               for (idx, stats), values in zip(self.pending, logged)]
        self.pending = []
        return out

    def flush(self, message_hub) -> None:
        """Log the pending statistics under ``test/`` in batch order.

        Raises:
            ValueError: If the STAG loss of any pass is not finite.
        """
        for idx, values, stag_names in self.read():
            for name in stag_names:
                if not math.isfinite(values[name]):
                    raise ValueError(
                        f'{name} is {values[name]} at batch {idx}: the STAG '
                        'loss is not finite (its features, logits or the '
                        'classifier contain nan or inf values)')
            for key, value in values.items():
                message_hub.update_scalar(f'test/{key}', value)


def read_tensors(tensors: List[torch.Tensor]) -> List[float]:
    """Read 0-d tensors as floats, one transfer per device."""
    by_device: Dict[torch.device, List[int]] = {}
    for i, t in enumerate(tensors):
        by_device.setdefault(t.device, []).append(i)
    out = [0.0] * len(tensors)
    for positions in by_device.values():
        stacked = torch.stack([tensors[i].double() for i in positions])
        for i, value in zip(positions, stacked.tolist()):
            out[i] = value
    return out
