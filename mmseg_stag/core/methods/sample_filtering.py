"""The base of the two-filter baselines (EATA, DeYO) and the optimizer of
their authors' code (SAR's too)."""
import torch

from ..task_adapter import PassStats
from .base import BaseMethod

#: the optimizer of the EATA, SAR and DeYO authors' code
AUTHORS_SGD = dict(type='SGD', lr=0.00025, momentum=0.9)


class SampleFilteringMethod(BaseMethod):
    """Base of the two-filter baselines (EATA, DeYO); counts kept samples."""

    supported_prediction_kinds = ('per_sample', 'per_pixel')
    default_optimizer = AUTHORS_SGD
    state_attributes = ('num_samples_update_1', 'num_samples_update_2')
    num_samples_update_1 = 0  # passed the first filter, so far
    num_samples_update_2 = 0  # passed both filters, so far

    def record_selection(self, stats: PassStats, reliable: torch.Tensor,
                         selected: torch.Tensor) -> int:
        """Count one batch's kept samples; return how many are selected."""
        # one read from the device for both counts
        num_reliable, num_selected = (int(n) for n in torch.stack(
            [reliable.sum(), selected.sum()]).tolist())
        self.num_samples_update_1 += num_reliable
        self.num_samples_update_2 += num_selected
        stats.extra.update(num_reliable=float(num_reliable),
                           num_selected=float(num_selected))
        return num_selected
