"""The methods' per-step statistics, read from the device in batches."""
import math
from typing import Dict, List, Tuple

import torch

from mmseg_stag.core import StepStats


#: the statistics of the steps since the last read, in batch order:
#: ``(batch index, StepStats)``, kept as they come (the loop's list)
Pending = List[Tuple[int, StepStats]]


def log_step_stats(pending: Pending, message_hub) -> None:
    """Log the pending statistics under ``test/`` in batch order, read in
    one transfer (reading each 0-d tensor, ``.item()``, would drain the GPU
    queue); ``ValueError`` if the STAG loss of any pass is not finite."""
    logged = [stats.logged() for _, stats in pending]
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
    for (idx, stats), values in zip(pending, logged):
        values = {k: next(floats) if torch.is_tensor(v) else float(v)
                  for k, v in values.items()}
        for name, _ in stats.stag_values():
            if not math.isfinite(values[name]):
                raise ValueError(
                    f'{name} is {values[name]} at batch {idx}: the STAG '
                    'loss is not finite (its features, logits or the '
                    'classifier contain nan or inf values)')
        for key, value in values.items():
            message_hub.update_scalar(f'test/{key}', value)
