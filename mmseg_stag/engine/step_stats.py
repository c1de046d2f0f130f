"""The methods' per-step statistics, read from the device in batches."""
import math
from typing import Dict, List, Tuple, Union

import torch

Stat = Union[float, torch.Tensor]

#: statistics whose non-finite value stops the run (STAG's inputs went
#: bad): ``loss_stag`` and a method's per-pass ``loss_stag1``, ``loss_stag2``
FINITE_PREFIXES = ('loss_stag', )


class StepStats:
    """Statistics of the steps since the last read, kept as they come.

    A method returns 0-d tensors where reading a value would wait for the
    device (``.item()`` drains the GPU queue); :meth:`flush` reads all of
    them in one transfer, at the logger's interval.
    """

    def __init__(self):
        self.pending: List[Tuple[int, Dict[str, Stat]]] = []

    def append(self, idx: int, stats: Dict[str, Stat]) -> None:
        """Keep the statistics of batch ``idx``."""
        self.pending.append((idx, dict(stats)))

    def read(self) -> List[Tuple[int, Dict[str, float]]]:
        """Return the pending statistics as floats and forget them."""
        tensors = [v.detach().reshape(()) for _, stats in self.pending
                   for v in stats.values() if torch.is_tensor(v)]
        values = iter(read_tensors(tensors))
        out = [(idx, {k: next(values) if torch.is_tensor(v) else float(v)
                      for k, v in stats.items()})
               for idx, stats in self.pending]
        self.pending = []
        return out

    def flush(self, message_hub) -> None:
        """Log the pending statistics under ``test/`` in batch order.

        Raises:
            ValueError: If a statistic named with a prefix of
                :data:`FINITE_PREFIXES` is not finite.
        """
        for idx, stats in self.read():
            for key in stats:
                if key.startswith(FINITE_PREFIXES) and \
                        not math.isfinite(stats[key]):
                    raise ValueError(
                        f'{key} is {stats[key]} at batch {idx}: the STAG '
                        'loss is not finite (its features, logits or the '
                        'classifier contain nan or inf values)')
            for key, value in stats.items():
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
