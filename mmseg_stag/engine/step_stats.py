"""The methods' per-step statistics, read from the device in batches."""
import math
from typing import Dict, List, Tuple

import torch

from mmseg_stag.core import StepStats


#: the statistics of the steps since the last read, in batch order:
#: ``(batch index, StepStats)``, kept as they come (the loop's list)
Pending = List[Tuple[int, StepStats]]


def read_step_stats(pending: Pending
                    ) -> List[Tuple[int, Dict[str, float], List[str]]]:
    """Return the pending statistics as ``(batch index, values by logged
    name, the names of its STAG values)``, read in one transfer (reading
    each 0-d tensor, ``.item()``, would drain the GPU queue)."""
    logged = [stats.logged() for _, stats in pending]
    tensors = [v.detach().reshape(()) for values in logged
               for v in values.values() if torch.is_tensor(v)]
    floats = iter(read_tensors(tensors))
    return [(idx, {k: next(floats) if torch.is_tensor(v) else float(v)
                   for k, v in values.items()},
             [name for name, _ in stats.stag_values()])
            for (idx, stats), values in zip(pending, logged)]


def log_step_stats(pending: Pending, message_hub) -> None:
    """Log the pending statistics under ``test/`` in batch order
    (``ValueError`` if the STAG loss of any pass is not finite)."""
    for idx, values, stag_names in read_step_stats(pending):
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
