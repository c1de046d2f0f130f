"""The one definition of a counted update (docs/methods.md, "Counted
updates"): ``t`` of ``beta_t`` and ``num_updates`` of a method
(:class:`~.base.BaseMethod`), counted by ``BaseMethod.adapt`` alone."""
import functools
from typing import Any, Callable

import torch

from ..stag import stag_beta


class UpdateCount:
    """A step (one batch) counts once exactly when it applied at least one
    optimizer step to the adapted parameters (:meth:`applied_update`);
    under fp16 the ``GradScaler``'s decision is a device tensor, and the
    count stays on the device until :attr:`t` or :attr:`num_updates` is
    read."""

    #: the counts behind :attr:`t` and :attr:`num_updates`: ints, or 0-d
    #: device tensors once a ``GradScaler`` decided whether a step counts
    _t: Any = 0
    _num_updates: Any = 0
    #: while a step runs (:func:`counts_updates`): whether it has applied
    #: an optimizer step so far (a bool, or a 0-d device bool tensor)
    _step_applied: Any = None

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        step = vars(cls).get('forward_and_adapt')
        if step is not None and not getattr(step, 'counts_updates', False):
            cls.forward_and_adapt = counts_updates(step)

    @property
    def t(self) -> int:
        """``t`` of ``beta_t``: the counted updates since ``beta_0`` (or
        its restart); reads the device under fp16 (call it outside a
        step)."""
        return int(self._t)

    @t.setter
    def t(self, value: int) -> None:
        self._t = int(value)

    @property
    def num_updates(self) -> int:
        """The counted updates (docs/methods.md, "Counted updates")."""
        return int(self._num_updates)

    @num_updates.setter
    def num_updates(self, value: int) -> None:
        self._num_updates = int(value)

    def step_beta(self) -> Any:
        """``beta_t`` for the next step without reading the device: a float,
        or (``t`` counted on the device, fp16) a 0-d float32 tensor there;
        None without STAG."""
        if self.stag_loss is None:
            return None
        if not torch.is_tensor(self._t):
            return self.beta
        beta0, gamma = self.stag_cfg['beta0'], self.stag_cfg['gamma']
        stag_beta(beta0, gamma, 0)  # the same checks of beta0 and gamma
        return (float(beta0) * torch.exp(
            self._t.to(torch.float64) / -float(gamma))).float()

    def applied_update(self, applied: Any = True) -> None:
        """Record, inside a step, an optimizer step on the adapted
        parameters: ``applied`` True, or a 0-d device bool tensor (whether
        the ``GradScaler`` let it run). Every optimizer step of a method
        goes through here (:meth:`backward_step`; SAR's own steps); the
        step counts once if any was applied (:meth:`adapt`)."""
        if self._step_applied is None:  # outside a step: nothing counts
            return
        self._step_applied = applied if self._step_applied is False else (
            self._step_applied | applied)

    def count_update(self, updated: Any) -> None:
        """Count a step whose ``StepStats.updated`` is ``updated``: a bool,
        or a 0-d device bool tensor (fp16), added on the device."""
        if torch.is_tensor(updated):
            updated = updated.to(torch.long)
        elif not updated:
            return
        else:
            updated = 1
        self._t, self._num_updates = (self._t + updated,
                                      self._num_updates + updated)


def counts_updates(step: Callable) -> Callable:
    """``step`` (a ``forward_and_adapt``) setting its ``StepStats.updated``
    to whether it applied an optimizer step (:meth:`BaseMethod.
    applied_update`): set at a capture, so a CUDA graph's replays carry
    their capture's. A nested call (``super().forward_and_adapt``) adds to
    the outer step's record."""
    @functools.wraps(step)
    def counted(self, *args, **kwargs):
        if self._step_applied is not None:
            return step(self, *args, **kwargs)
        self._step_applied = False
        try:
            prediction, stats = step(self, *args, **kwargs)
            stats.updated = self._step_applied
        finally:  # back to the class's None, the instance's vars as before
            vars(self).pop('_step_applied', None)
        return prediction, stats
    counted.counts_updates = True
    return counted


def scaler_applied(scaler, optimizer) -> torch.Tensor:
    """Whether ``scaler.step(optimizer)`` ran the optimizer's step, as a 0-d
    device bool tensor (no host read): the scaler's own decision, its
    non-finite flags per device, which ``scaler.update()`` forgets (call
    this between the two). A fused optimizer gets the same flags and skips
    on the device; another is skipped by the scaler's host read."""
    # no public API gives the decision without a host read (get_scale()
    # and the optimizer's state would both sync): the scaler's own flags
    found = list(scaler._found_inf_per_device(optimizer).values())
    return torch.stack([f.to(found[0].device) for f in found]).sum() == 0
