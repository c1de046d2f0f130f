"""The base class of the online-adaptation methods and STAG's place in it;
the life cycle of DequanWang/tent's tent.py (Tent.forward); the one
definition of a counted update (:class:`UpdateCount`; docs/methods.md,
"Counted updates")."""
import functools
from typing import Any, Callable, List, Optional, Sequence, Tuple

import torch
import torch.nn as nn
from mmengine.optim import OPTIMIZERS  # importing it registers torch.optim

from ..losses import mean_over_outputs
from ..params import check_trainable, select_parameters, use_batch_statistics
from ..probe import PREDICTION_KINDS
from ..registry import check_stage_restart, check_supports
from ..stag import stag_beta
from ..stag_loss import build_stag_loss, log_anchor_signs
from ..task_adapter import (Batch, ForwardPass, Logits, Prediction, StepStats,
                            TaskAdapter)
from .method_state import MethodState, restart_in_place


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


def check_update_options(method, optimizer: Optional[dict],
                         trainable: Optional[dict]) -> None:
    """``ValueError`` naming ``optimizer`` or ``trainable`` when given
    to a method that, as configured, never updates (no loss: Source,
    BN Adapt without STAG), or when it cannot be used: ``trainable`` as
    :func:`~..params.check_trainable` says, ``optimizer`` unless it
    builds (a registered type, arguments it takes)."""
    if not method.has_loss:
        for option, given in (('optimizer', optimizer),
                              ('trainable', trainable)):
            if given is not None:
                raise ValueError(
                    f'{method.name} has no loss (no stag), so nothing '
                    f'uses its {option} option: remove it, or add '
                    'stag to update by beta_t * L_STAG')
        return
    check_trainable(method.trainable_cfg)
    probe = nn.Parameter(torch.zeros(1))
    try:
        OPTIMIZERS.build(dict(method.optimizer_cfg, params=[probe]))
    except (KeyError, TypeError, ValueError) as err:
        raise ValueError(f'{method.name}: optimizer={method.optimizer_cfg} '
                         f'cannot be built: {err}') from None


class BaseMethod(UpdateCount, MethodState):
    """Base class of the online-adaptation methods.

    Its life cycle and options (``stag``, ``optimizer``, ``trainable``,
    ``stage_restart``, ``bn_batch_stats``): docs/methods.md ("How a method
    runs").

    Raises:
        ValueError: If ``stag`` lacks ``beta0`` or ``gamma``,
            ``stage_restart`` names what the method does not have, or
            ``optimizer`` or ``trainable`` is given and cannot be used
            (:func:`check_update_options`).
    """

    #: whether the method has a loss of its own (``L_base``)
    has_base_loss = True
    #: the prediction kinds the method is defined on
    supported_prediction_kinds: Tuple[str, ...] = PREDICTION_KINDS
    #: whether :meth:`fit_source` must be given clean source batches
    needs_source_data = False
    #: whether the updates can go through a ``GradScaler`` (fp16)
    supports_grad_scaler = True
    #: whether the step (:meth:`forward_and_adapt`) can be replayed as a
    #: CUDA graph (:class:`~.step_graph.CUDAGraphStep`): no host read, no
    #: host-side branch on a device value
    graph_capturable = False
    #: attributes :meth:`__repr__` shows after the base options
    repr_fields: Tuple[str, ...] = ()
    #: the ``optimizer`` and ``trainable`` configs when none is given
    default_optimizer = dict(type='Adam', lr=7.5e-6, betas=(0.9, 0.999))
    default_trainable = dict(kind='norm_affine')

    def __init__(self,
                 stag: Optional[dict] = None,
                 optimizer: Optional[dict] = None,
                 trainable: Optional[dict] = None,
                 stage_restart: Sequence[str] = (),
                 bn_batch_stats: bool = False):
        self.stag_cfg = None if stag is None else dict(stag)
        self.stag_loss = build_stag_loss(self.stag_cfg)
        self.optimizer_cfg = dict(optimizer or self.default_optimizer)
        self.trainable_cfg = dict(trainable or self.default_trainable)
        #: BatchNorm normalises with the test batch's statistics
        self.bn_batch_stats = bool(bn_batch_stats)

        self.model: Optional[nn.Module] = None
        self.task_adapter: Optional[TaskAdapter] = None
        self.classifier: Optional[nn.Module] = None
        self.optimizer = None
        self.params: List[Tuple[str, nn.Parameter]] = []
        self.t = 0  # t of beta_t: the updates since beta_0 (or its restart)
        self.num_updates = 0
        self.stage_index: Optional[int] = None  # the stage's, in the stream
        self.grad_scaler: Optional[torch.amp.GradScaler] = None
        #: whether there is a loss (its own or STAG): :meth:`adapt` runs a
        #: backward pass and an optimizer step
        self.has_loss = self.has_base_loss or self.stag_loss is not None
        #: what restarts at a new stage of the stream (a subset of
        #: STAGE_RESTARTS); a stage from the source restarts everything
        self.stage_restart = check_stage_restart(self, stage_restart)
        check_update_options(self, optimizer, trainable)

    name = property(lambda self: type(self).__name__)  # in messages

    @property
    def beta(self) -> float:
        """Current ``beta_t``, 0 without STAG (eq:adaptive_decay)."""
        if self.stag_cfg is None:
            return 0.0
        return stag_beta(self.stag_cfg['beta0'], self.stag_cfg['gamma'],
                         self.t)

    #: whether the method, as configured, needs logits, labels and a loss
    #: at each image's original size (``TaskAdapter.has_original_size``)
    needs_original_size = False

    def check_supports(self, task_adapter: TaskAdapter) -> None:
        """``ValueError`` unless the method is defined on the task
        ``task_adapter`` serves (:func:`~..registry.check_supports`)."""
        check_supports(self, task_adapter)

    def configure(self, model: nn.Module, task_adapter: TaskAdapter) -> None:
        """Set the modes, unfreeze the adapted parameters, build the optimizer;
        ``ValueError`` if no parameter matches ``trainable``."""
        self.check_supports(task_adapter)
        self.prepare_model(model)
        self.model, self.task_adapter = model, task_adapter
        self.classifier = task_adapter.classifier(model)
        model.requires_grad_(False)
        self.set_modes(model)
        if self.bn_batch_stats:  # after the modes: BN Adapt's and others'
            use_batch_statistics(model)
        if not self.has_loss:
            self.params = []
            return
        self.params = select_parameters(model, **self.trainable_cfg)
        if not self.params:
            raise ValueError(f'{self.name}: no parameter matches trainable='
                             f'{self.trainable_cfg}')
        for _, p in self.params:
            p.requires_grad_(True)
        self.optimizer = self.build_optimizer()
        if self.stag_loss is not None:
            log_anchor_signs(self.classifier)

    def prepare_model(self, model: nn.Module) -> None:
        """Change ``model`` before its parameters are selected, after the
        support check (Hybrid-TTA adds its modules); nothing by default."""

    def use_grad_scaler(self, device_type: str = 'cuda') -> None:
        """Scale the losses of every update (float16 autocast)."""
        if not self.supports_grad_scaler:
            raise ValueError(f'{self.name} cannot scale its gradients (a '
                             'GradScaler); use bfloat16 or float32')
        self.grad_scaler = torch.amp.GradScaler(device_type)

    def build_optimizer(self):
        return OPTIMIZERS.build(
            dict(self.optimizer_cfg, params=[p for _, p in self.params]))

    def set_modes(self, model: nn.Module) -> None:
        """Set the layers' train/eval modes (once, in :meth:`configure`)."""
        model.eval()

    def fit_source(self, batches) -> None:
        """Take statistics from clean source batches; nothing by default."""

    def source_statistics(self) -> Any:
        """What :meth:`fit_source` computed (None by default)."""
        return None

    def load_source_statistics(self, statistics: Any) -> None:
        """Use :meth:`source_statistics` of an earlier fit instead."""

    def start_stage(self, index: int) -> None:
        """Restart what ``stage_restart`` names when the stage ``index``
        (``StreamStage.index``) differs from the last one."""
        if self.stage_index is not None and index != self.stage_index:
            if 'beta_t' in self.stage_restart:
                self.t = 0
            # in place where it can (a CUDA graph stepping its state
            # survives the stage)
            if 'optimizer' in self.stage_restart and not restart_in_place(
                    self.optimizer):
                self.optimizer = self.build_optimizer()
        self.stage_index = index

    def base_loss(self, batch: Batch,
                  fwd: ForwardPass) -> Optional[torch.Tensor]:
        """Return ``L_base`` (eq:total_objective), None if nothing is kept."""
        raise TypeError(f'{self.name} has no base_loss')

    def loss(self, batch: Batch, fwd: ForwardPass,
             beta: Any = None) -> Optional[torch.Tensor]:
        """Return ``L_base + beta_t L_STAG`` (eq:total_objective), None if
        there is nothing to minimise; ``beta``: ``beta_t`` (a float or a 0-d
        tensor; default :attr:`beta`)."""
        base = self.base_loss(batch, fwd) if self.has_base_loss else None
        return self.add_stag(base, fwd, beta)

    def add_stag(self, base: Optional[torch.Tensor], fwd: ForwardPass,
                 beta: Any = None) -> Optional[torch.Tensor]:
        """Return ``base + beta_t L_STAG`` (just ``base`` without STAG);
        ``beta`` as in :meth:`loss`."""
        stats, total = fwd.stats, base
        if base is not None:
            stats.loss_base = base.detach()
        if self.stag_loss is not None:
            # eq:stag_batch_loss, each classifier call's pairs by their size
            l_stag = mean_over_outputs(functools.partial(
                self.stag_loss, cls_weight=self.classifier.weight,
                cls_bias=self.classifier.bias), fwd.head_outputs)
            beta = self.beta if beta is None else beta
            stats.loss_stag, stats.beta = l_stag.detach(), beta
            total = beta * l_stag if total is None else total + beta * l_stag
        if total is not None:
            stats.loss = total.detach()
        return total

    def zero_grad(self) -> None:
        """Set the adapted parameters' gradients to None."""
        if self.optimizer is not None:
            self.optimizer.zero_grad(set_to_none=True)

    def backward_step(self, loss: torch.Tensor) -> None:
        """Zero the gradients, backward ``loss``, step, record it (fp16: a
        step whose gradients overflow is skipped, and not counted)."""
        self.optimizer.zero_grad(set_to_none=True)
        scaler = self.grad_scaler
        if scaler is None or not scaler.is_enabled():
            (loss if scaler is None else scaler.scale(loss)).backward()
            self.optimizer.step()
            self.applied_update()
            return
        scaler.scale(loss).backward()
        scaler.step(self.optimizer)
        applied = scaler_applied(scaler, self.optimizer)  # before update()
        scaler.update()
        self.applied_update(applied)

    def check_configured(self) -> None:
        """Raise ``RuntimeError`` if :meth:`configure` has not run."""
        if self.model is None:
            raise RuntimeError(f'{self.name}.configure(model, task_adapter) '
                               'must be called before adapting')

    def adapt(self, batch: Batch, replay: Optional[Callable] = None
              ) -> Tuple[Prediction, StepStats]:
        """Predict, then adapt: one step, :meth:`forward_and_adapt`, or
        ``replay(batch, beta_t)``, which replays it (a
        :class:`~.step_graph.CUDAGraphStep`); return the step's prediction
        (which forward's: docs/methods.md, "Forwards, steps and the
        prediction") and its :class:`StepStats`.

        The one entry point of a step: a method implements
        :meth:`forward_and_adapt` and nothing else of it. The step is
        counted here alone (:class:`UpdateCount`: once where
        it applied an optimizer step, ``StepStats.updated``; no host read).
        """
        self.check_configured()
        beta = self.step_beta()
        prediction, stats = (replay or self.forward_and_adapt)(batch, beta)
        self.count_update(stats.updated)
        return prediction, stats

    @staticmethod
    def prediction(fwd: ForwardPass) -> Logits:
        """The prediction of forward pass ``fwd``: its output, detached,
        with the post-processing a loss made of it."""
        return Logits(fwd.output.detach(), fwd.postprocessed)

    def forward_and_adapt(self, batch: Batch, beta: Any
                          ) -> Tuple[Prediction, StepStats]:
        """The step, without counting: forward, then backward and one
        optimizer step on :meth:`loss` where there is one; ``beta``:
        ``beta_t`` (a float, or a 0-d device tensor: filled before each
        replay of a captured step; under fp16). Every override is wrapped
        by :func:`counts_updates`, which sets ``StepStats.updated``."""
        fwd = self.task_adapter.forward(self.model, batch)
        total = self.loss(batch, fwd, beta) if self.has_loss else None
        if total is not None:
            self.backward_step(total)
        return self.prediction(fwd), StepStats([fwd.stats])

    def __repr__(self) -> str:
        stag = 'off' if self.stag_cfg is None else self.stag_cfg
        extra = ''.join(f', {f}={getattr(self, f)!r}' for f in (
            'stage_restart', 'bn_batch_stats', *self.repr_fields))
        return (f'{self.name}(stag={stag}, optimizer={self.optimizer_cfg}, '
                f'trainable={self.trainable_cfg}{extra})')

