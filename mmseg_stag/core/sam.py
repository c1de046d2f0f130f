"""SAM (Foret et al., ICLR 2021) shaped as the SAR authors' ``sam.py``."""
from typing import List

import torch


class SAM(torch.optim.Optimizer):
    """Sharpness-aware minimisation around a built base optimizer, which
    takes the step and whose groups become SAM's; ``rho``: the
    neighbourhood size."""

    def __init__(self, base_optimizer: torch.optim.Optimizer,
                 rho: float = 0.05):
        if not rho >= 0:
            raise ValueError(f'rho must be >= 0, got {rho}')
        super().__init__(base_optimizer.param_groups, dict(rho=rho))
        self.base_optimizer = base_optimizer
        self.param_groups = base_optimizer.param_groups

    def with_grads(self, group: dict) -> List[torch.Tensor]:
        """The parameters of ``group`` that have a gradient."""
        return [p for p in group['params'] if p.grad is not None]

    @torch.no_grad()
    def grad_norm(self) -> torch.Tensor:
        """2-norm of the per-parameter gradient 2-norms."""
        grads = [p.grad for group in self.param_groups
                 for p in self.with_grads(group)]
        return torch.norm(torch.stack(torch._foreach_norm(grads, 2)), p=2)

    @torch.no_grad()
    def first_step(self) -> None:
        """Move to ``theta + rho g / (||g|| + 1e-12)``; no-op without grads."""
        if not any(self.with_grads(group) for group in self.param_groups):
            return
        norm = self.grad_norm()
        for group in self.param_groups:
            params = self.with_grads(group)
            if not params:
                continue
            scale = group['rho'] / (norm + 1e-12)
            olds = [torch.empty_like(p) for p in params]
            torch._foreach_copy_(olds, params)
            for p, old in zip(params, olds):
                self.state[p]['old_p'] = old
            # one kernel per operation for all parameters (as p + g * scale)
            torch._foreach_add_(params, torch._foreach_mul(
                [p.grad for p in params], scale.to(params[0])))

    @torch.no_grad()
    def unperturb(self) -> None:
        """Back to ``theta`` wherever :meth:`first_step` moved."""
        moved, olds = [], []
        for group in self.param_groups:
            for p in group['params']:
                old = self.state[p].pop('old_p', None)
                if old is not None:
                    moved.append(p)
                    olds.append(old)
        if moved:
            torch._foreach_copy_(moved, olds)

    @torch.no_grad()
    def second_step(self) -> None:
        """Restore ``theta``; step with the gradients at ``theta + e_w``."""
        self.unperturb()
        self.base_optimizer.step()

    def state_dict(self) -> dict:
        """The base optimizer's state (SAM keeps none between steps)."""
        return self.base_optimizer.state_dict()

    def load_state_dict(self, state_dict: dict) -> None:
        """Load the base optimizer's state and share its new param groups."""
        self.base_optimizer.load_state_dict(state_dict)
        self.param_groups = self.base_optimizer.param_groups

    def step(self, closure=None):
        raise RuntimeError('SAM needs first_step() and second_step() around '
                           'a second forward/backward pass')

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.base_optimizer.zero_grad(set_to_none=set_to_none)
