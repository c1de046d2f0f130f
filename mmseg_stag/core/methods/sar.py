"""SAR (Niu et al., ICLR 2023): sharpness-aware reliable adaptation."""
import copy
import math
from typing import Optional, Tuple

import torch

from ..losses import flatten_logits, softmax_entropy
from ..params import exclude_modules
from ..registry import METHODS, check_range
from ..sam import SAM
from ..task_adapter import Batch, ForwardPass, StepStats
from .base import BaseMethod
from .sample_filtering import AUTHORS_SGD

#: Modules SAR's collect_params never adapts (last stage, final norm).
SAR_AUTHORS_EXCLUDE = r'layer4|blocks\.9|blocks\.10|blocks\.11|norm\.|^norm$'


@METHODS.register_module(name='sar')
class SAR(BaseMethod):
    """SAR: reliable entropy minimisation with a SAM update and recovery.

    Follows SAR's sar.py (forward_and_adapt_sar, SAR.forward); the options,
    their defaults and the deviations: docs/methods.md (SAR). ``**kwargs``:
    see :class:`BaseMethod`.

    Raises:
        ValueError: If ``entropy_margin <= 0`` or ``rho < 0``.
    """

    supported_prediction_kinds = ('per_sample', 'per_pixel')
    #: SAM's ascent step needs unscaled gradients between two backwards
    supports_grad_scaler = False
    repr_fields = ('entropy_margin', 'rho', 'recovery_threshold',
                   'recovery_restores_optimizer', 'recovery_clears_ema',
                   'exclude_regex')
    default_optimizer = AUTHORS_SGD
    # the recovery targets come from configure
    state_attributes = ('ema', 'num_recoveries')

    def __init__(self,
                 entropy_margin: float = 0.4,
                 rho: float = 0.05,
                 recovery_threshold: float = 0.2,
                 exclude_regex: Optional[str] = SAR_AUTHORS_EXCLUDE,
                 momentum_step_on_empty: bool = True,
                 recovery_restores_optimizer: bool = False,
                 recovery_clears_ema: bool = False,
                 **kwargs):
        check_range('> 0', entropy_margin=entropy_margin)
        check_range('>= 0', rho=rho)
        super().__init__(**kwargs)
        self.entropy_margin = float(entropy_margin)
        self.rho = float(rho)
        self.recovery_threshold = float(recovery_threshold)
        self.exclude_regex = exclude_regex
        self.momentum_step_on_empty = bool(momentum_step_on_empty)
        self.recovery_restores_optimizer = bool(recovery_restores_optimizer)
        self.recovery_clears_ema = bool(recovery_clears_ema)
        self.e_margin: Optional[float] = None
        self.ema: Optional[float] = None
        self.num_recoveries = 0
        self._initial_params = {}
        self._initial_optimizer = None

    def build_optimizer(self):
        return SAM(super().build_optimizer(), rho=self.rho)

    def configure(self, model, task_adapter):
        super().configure(model, task_adapter)
        exclude_modules(self, self.exclude_regex)
        self.e_margin = self.entropy_margin * math.log(
            int(self.classifier.weight.shape[0]))
        self.ema = None
        self._initial_params = {n: p.detach().clone()
                                for n, p in self.params}
        self._initial_optimizer = copy.deepcopy(
            self.optimizer.base_optimizer.state_dict())

    def reliable_entropy(self, fwd: ForwardPass,
                         among: Optional[torch.Tensor] = None
                         ) -> Tuple[Optional[torch.Tensor], torch.Tensor]:
        """Return the mean entropy of the samples of ``fwd`` below ``E0``
        (of those ``among`` keeps, if given; None if none) and their mask."""
        logits = flatten_logits(fwd.head_outputs)
        entropies = softmax_entropy(logits)
        keep = entropies < self.e_margin
        if among is not None:
            keep = keep & among
        fwd.stats.extra['num_kept'] = float(keep.sum())
        if not bool(keep.any()):
            return None, keep
        return entropies[keep].mean(0), keep

    def restore_initial(self) -> None:
        """Restore the parameters of ``configure``; follows SAR.reset."""
        with torch.no_grad():
            for name, p in self.params:
                p.copy_(self._initial_params[name])
        if self.recovery_restores_optimizer:
            # deviation: SAR.reset keeps the momentum buffers
            self.optimizer.load_state_dict(
                copy.deepcopy(self._initial_optimizer))
        self.ema = None
        self.num_recoveries += 1

    def recover(self) -> bool:
        """Recover when ``ema < recovery_threshold``, as SAR.forward;
        return whether it did."""
        ema = self.ema
        if ema is None or not ema < self.recovery_threshold:
            return False
        self.restore_initial()
        if not self.recovery_clears_ema:  # deviation if set: it stays None
            self.ema = ema  # sar.py SAR.forward: `self.ema = ema` after reset
        return True

    def update_ema(self, loss: float) -> None:
        """``ema <- 0.9 ema + 0.1 loss`` of the second pass (SAR.forward)."""
        self.ema = loss if self.ema is None else \
            0.9 * self.ema + (1 - 0.9) * loss

    def forward_and_adapt(self, batch: Batch, beta=None):
        sam = self.optimizer
        second, loss2 = None, None
        try:
            # forward 1 (the prediction), filter 1, L1, backward
            first = self.task_adapter.forward(self.model, batch)
            entropy1, kept = self.reliable_entropy(first)
            loss1 = self.add_stag(entropy1, first, beta)
            sam.zero_grad(set_to_none=True)
            if loss1 is not None:
                loss1.backward()
                sam.first_step()  # theta + e_w
                sam.zero_grad(set_to_none=True)
                # forward 2 at theta + e_w, filter 2 among filter 1
                second = self.task_adapter.forward(self.model, batch)
                entropy2, _ = self.reliable_entropy(second, among=kept)
                loss2 = self.add_stag(entropy2, second, beta)
                if entropy2 is not None:
                    # the recovery decides on the host (as the authors')
                    self.update_ema(float(entropy2))
                if loss2 is not None:
                    loss2.backward()
                    sam.second_step()  # back to theta, base optimizer step
                    self.applied_update()
        finally:
            sam.unperturb()  # back to theta whatever happened
        # the SAM update ran (the second step); else, by default, the
        # momentum-only step: either is an optimizer step, counted once
        updated = loss2 is not None
        # each pass's names numbered (loss_stag1, loss_stag2), even alone
        stats = StepStats([first.stats] + ([] if second is None
                                           else [second.stats]),
                          numbered=True)
        if not updated and self.momentum_step_on_empty:
            # the authors' NaN loss gives zero gradients: momentum only
            # (their optimizer.step() runs, moving theta by the momentum
            # buffer and any weight decay)
            moves = momentum_step_moves(sam.base_optimizer)
            for _, p in self.params:
                p.grad = torch.zeros_like(p)
            sam.base_optimizer.step()
            if moves:
                self.applied_update()
        sam.zero_grad(set_to_none=True)
        stats.extra.update(
            updated=float(updated),
            momentum_only_step=float(
                not updated and self.momentum_step_on_empty),
            recovered=float(self.recover()))
        if self.ema is not None:
            stats.extra['ema'] = self.ema
        return self.prediction(first), stats


def momentum_step_moves(optimizer) -> bool:
    """Whether a step on zero gradients can move the parameters, known on
    the host: where ``optimizer`` holds state from an earlier step (SGD's
    momentum buffers, Adam's moments) or applies weight decay. A fresh
    optimizer's zero-gradient step moves nothing (SGD's new buffer is the
    zero gradient), so SAR does not count it; a state zeroed in place by a
    stage restart (``restart_in_place``) is counted though it is zero."""
    if any(group.get('weight_decay', 0) for group in optimizer.param_groups):
        return True
    return any(torch.is_tensor(value) for state in optimizer.state.values()
               for key, value in state.items() if key != 'step')
