"""SAR (Niu et al., ICLR 2023): sharpness-aware and reliable entropy
minimisation.

Follows the authors' code (github.com/mr-eggplant/SAR, ``sar.py``
``forward_and_adapt_sar``, ``sam.py`` and ``collect_params``).
"""
import copy
import math
from typing import Dict, Optional

import torch

from mmseg_stag.registry import TTA_METHODS
from .base import TTAMethod, per_sample_logits, softmax_entropy

#: Module names the authors' ``collect_params`` never adapts: the last stage
#: (``layer4`` of ResNets, ``blocks.9``-``blocks.11`` of ViT-B) and the final
#: ``norm`` (substring tests on module names, as in their code).
SAR_AUTHORS_EXCLUDE = r'layer4|blocks\.9|blocks\.10|blocks\.11|norm\.|^norm$'


@TTA_METHODS.register_module(name=['SAR', 'sar'])
class SAR(TTAMethod):
    """SAR: reliable entropy minimisation with a SAM update and recovery.

    One ``adapt`` call (authors' ``forward_and_adapt_sar``):

    1. forward 1 (its logits are the prediction returned); entropies ``H``,
       filter 1 ``H < E0`` (``E0 = entropy_margin * ln C``);
       ``L1 = mean_{filter 1} H (+ beta_t L_STAG on every sample)``;
       backward;
    2. SAM first step: ``e_w = rho * g / (||g|| + 1e-12)`` (``||g||`` the
       2-norm of the per-parameter gradient 2-norms), ``theta += e_w``;
    3. forward 2 at ``theta + e_w``; entropies ``H2`` of the filter-1
       samples, filter 2 ``H2 < E0``;
       ``L2 = mean_{filter 2} H2 (+ beta_t L_STAG on every sample of
       forward 2)``; ``ema = 0.9 ema + 0.1 mean_{filter 2} H2`` (the base
       loss value only); backward;
    4. SAM second step: ``theta`` back to its old values, one step of the
       base optimizer (SGD), gradients zeroed;
    5. recovery: if ``ema < reset_constant``, the trainable parameters and
       the optimizer state return to their values at ``configure`` and
       ``ema`` to ``None`` (counted in ``num_resets``).

    ``beta_t`` is the same in both forwards and advances once per update.

    Empty filters (STAG off). The authors take the mean of an empty set
    (NaN) and still run ``backward``: the gradients are then exactly zero,
    so ``e_w = 0`` and the base optimizer steps with zero gradients, which
    with momentum SGD moves the parameters by the momentum buffer alone;
    ``ema`` is not updated (their ``isnan`` check). With
    ``momentum_step_on_empty=True`` (default) this implementation does the
    same without any NaN: no backward, no perturbation and no second
    forward when filter 1 is empty (they have no effect), the parameters
    are always restored to ``theta``, and the base optimizer steps with
    zero gradients (a momentum-only step; nothing moves while the momentum
    buffer is empty). ``False`` skips that step: no update at all. A
    momentum-only step is not counted in ``num_updates``/``step``. With
    STAG on the losses always exist (``L_STAG`` covers every sample), so
    every call is a full SAM update.

    Args:
        entropy_margin (float): ``E0`` as a fraction of ``ln C``.
            Default: 0.4.
        rho (float): SAM neighbourhood size (non-adaptive SAM).
            Default: 0.05.
        reset_constant (float): recovery threshold ``e_m`` on the EMA of
            the loss. Default: 0.2.
        exclude_regex (str, optional): trainable parameters whose *module*
            name matches (``re.search``) are left frozen. Default: the
            authors' exclusion :data:`SAR_AUTHORS_EXCLUDE`; ``None``: keep
            every parameter chosen by ``trainable``.
        momentum_step_on_empty (bool): see above. Default: True.
        reset_optimizer (bool): the recovery also restores the optimizer
            state (momentum buffers). Default: True. The authors' reset
            calls ``SAM.load_state_dict``, which restores SAM's own state
            but not its base SGD's momentum buffers; ``False`` reproduces
            that.
        optimizer (dict): the base optimizer of SAM (MMEngine
            ``OPTIMIZERS``). Default: SGD lr 0.00025, momentum 0.9.
        **kwargs: see :class:`TTAMethod` (``stag``, ``trainable``, ...).
    """

    def __init__(self,
                 entropy_margin: float = 0.4,
                 rho: float = 0.05,
                 reset_constant: float = 0.2,
                 exclude_regex: Optional[str] = SAR_AUTHORS_EXCLUDE,
                 momentum_step_on_empty: bool = True,
                 reset_optimizer: bool = True,
                 optimizer: Optional[dict] = None,
                 **kwargs):
        if not entropy_margin > 0:
            raise ValueError(
                f'entropy_margin must be > 0, got {entropy_margin}')
        if not rho >= 0:
            raise ValueError(f'rho must be >= 0, got {rho}')
        super().__init__(
            optimizer=optimizer or dict(type='SGD', lr=0.00025,
                                        momentum=0.9),
            **kwargs)
        self.entropy_margin = float(entropy_margin)
        self.rho = float(rho)
        self.reset_constant = float(reset_constant)
        self.exclude_regex = exclude_regex
        self.momentum_step_on_empty = bool(momentum_step_on_empty)
        self.reset_optimizer = bool(reset_optimizer)
        self.e_margin: Optional[float] = None
        self.num_classes: Optional[int] = None
        self.ema: Optional[float] = None
        self.num_resets = 0
        self._initial_params: Dict[str, torch.Tensor] = {}
        self._initial_optimizer = None
        self._restrict: Optional[torch.Tensor] = None  # filter 1 in pass 2
        self._kept: Optional[torch.Tensor] = None
        self._base_value: Optional[float] = None

    def configure(self, model, classifier):
        super().configure(model, classifier)
        self.exclude_modules(self.exclude_regex)
        self.num_classes = int(classifier.weight.shape[0])
        self.e_margin = self.entropy_margin * math.log(self.num_classes)
        self.ema = None
        self._initial_params = {n: p.detach().clone()
                                for n, p in self.params}
        self._initial_optimizer = copy.deepcopy(self.optimizer.state_dict())

    # ------------------------------------------------------------------
    def base_loss(self, head_outputs) -> Optional[torch.Tensor]:
        """Mean entropy of the samples with ``H < E0`` (in the second
        forward, only among the first forward's kept samples); ``None``
        when none is kept."""
        _, logits = per_sample_logits(head_outputs, 'SAR')
        entropies = softmax_entropy(logits)
        keep = entropies < self.e_margin
        if self._restrict is not None:
            keep = keep & self._restrict
        self._kept = keep
        if not bool(keep.any()):
            self._base_value = None
            return None
        loss = entropies[keep].mean(0)
        self._base_value = loss.item()
        return loss

    @torch.no_grad()
    def _grad_norm(self) -> torch.Tensor:
        norms = [p.grad.norm(p=2) for _, p in self.params
                 if p.grad is not None]
        return torch.norm(torch.stack(norms), p=2)

    @torch.no_grad()
    def _first_step(self) -> Dict[str, torch.Tensor]:
        """``theta += rho g / (||g|| + 1e-12)``; returns the old values."""
        old = {}
        if not any(p.grad is not None for _, p in self.params):
            return old
        scale = self.rho / (self._grad_norm() + 1e-12)
        for name, p in self.params:
            if p.grad is None:
                continue
            old[name] = p.detach().clone()
            p.add_(p.grad * scale.to(p))
        return old

    @torch.no_grad()
    def _restore(self, old: Dict[str, torch.Tensor]) -> None:
        for name, p in self.params:
            if name in old:
                p.copy_(old[name])

    def reset(self) -> None:
        """Model recovery: trainable parameters (and, with
        ``reset_optimizer``, the optimizer state) back to their values at
        ``configure``; ``ema = None``."""
        with torch.no_grad():
            for name, p in self.params:
                p.copy_(self._initial_params[name])
        if self.reset_optimizer:
            self.optimizer.load_state_dict(
                copy.deepcopy(self._initial_optimizer))
        self.ema = None
        self.num_resets += 1

    def adapt(self, forward, inputs):
        if self.model is None:
            raise RuntimeError('SAR.configure(model, classifier) must be '
                               'called before adapt')
        self.set_modes(self.model)
        stats: Dict[str, float] = {}
        old: Dict[str, torch.Tensor] = {}
        loss2 = None
        try:
            with torch.enable_grad():
                # forward 1 (the prediction), filter 1, L1, backward
                self._restrict = None
                prediction, head_outputs = forward(self.model, inputs)
                loss1, stats1 = self.objective(head_outputs)
                keep1 = self._kept
                stats.update({k + '1': v for k, v in stats1.items()})
                stats['num_kept1'] = float(keep1.sum())
                self.optimizer.zero_grad(set_to_none=True)
                if loss1 is not None:
                    loss1.backward()
                    old = self._first_step()  # theta + e_w
                    self.optimizer.zero_grad(set_to_none=True)
                    # forward 2 at theta + e_w, filter 2 among filter 1
                    self._restrict = keep1
                    _, head_outputs2 = forward(self.model, inputs)
                    loss2, stats2 = self.objective(head_outputs2)
                    stats.update({k + '2': v for k, v in stats2.items()})
                    stats['num_kept2'] = float(self._kept.sum())
                    if self._base_value is not None:
                        self.ema = (self._base_value if self.ema is None
                                    else 0.9 * self.ema +
                                    (1 - 0.9) * self._base_value)
                    if loss2 is not None:
                        loss2.backward()
        finally:
            self._restrict = None
            self._restore(old)  # SAM second step: back to theta
        updated = loss2 is not None
        if updated:
            self.optimizer.step()
            self.step += 1
            self.num_updates += 1
        elif self.momentum_step_on_empty:
            # the authors' zero-gradient step (see the class docstring)
            for _, p in self.params:
                p.grad = torch.zeros_like(p)
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        stats['updated'] = float(updated)
        stats['momentum_only_step'] = float(
            not updated and self.momentum_step_on_empty)
        reset = self.ema is not None and self.ema < self.reset_constant
        if reset:
            self.reset()
        stats['reset'] = float(reset)
        if self.ema is not None:
            stats['ema'] = self.ema
        self.last_stats = stats
        return prediction.detach()

    def __repr__(self) -> str:
        return (super().__repr__()[:-1] +
                f', entropy_margin={self.entropy_margin}, rho={self.rho}, '
                f'reset_constant={self.reset_constant}, '
                f'exclude_regex={self.exclude_regex!r})')
