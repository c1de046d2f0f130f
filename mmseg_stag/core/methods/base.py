"""``BaseMethod``: what every online-adaptation method shares, and STAG's
place in it.

A method sees a model, its classifier, and a :class:`BatchContext` per batch:
the inputs, a ``forward(model, inputs) -> (prediction, head_outputs)``
callable (a :class:`~mmseg_stag.core.probe.HeadProbe`; methods call it again
for teachers or other views), and the head outputs of the batch's forward
pass: ``(features, logits)`` pairs, class axis at dim 1, ``[N, C]`` per
sample or ``[N, C, H, W]`` per pixel. The same classes serve segmentation
and classification.

Life cycle (DequanWang/tent, mariodoebler/test-time-adaptation)::

    method = build_method(dict(type='tent', stag=dict(beta0=500, gamma=35)))
    method.check_output('per_pixel')          # at build time: wrong task?
    method.configure(model, classifier, 'per_pixel')  # params, optimizer
    for each batch (the caller sets torch.set_grad_enabled(method.updates)):
        prediction, stats = method.adapt(BatchContext(inputs, forward))
        #  forward once -> loss(ctx) = base_loss(ctx) + beta_t L_STAG
        #  -> backward -> optimizer step; prediction made *before* the step
"""
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

import torch
import torch.nn as nn
from mmengine.logging import print_log
from mmengine.optim import OPTIMIZERS  # importing it registers torch.optim

from ..losses import HeadOutputs, mean_over_outputs
from ..params import exclude_by_module, select_parameters
from ..probe import OUTPUT_KINDS, Forward, check_output_kind
from ..stag import anchor_coefficients, stag_beta
from ..stag_loss import STAGLoss


@dataclass
class BatchContext:
    """One batch as a method sees it.

    Args:
        inputs: the model's inputs (e.g. preprocessed images ``[N, 3, H,
            W]``).
        forward: ``forward(model, inputs) -> (prediction, head_outputs)``.
        prediction: what the batch is evaluated on (set by the method's
            forward pass; CoTTA replaces it by its teacher's).
        head_outputs: ``[(features, logits), ...]`` of that forward pass.
        among: samples an earlier pass of the same batch kept (SAR's second
            forward filters only among them); ``None``: all.
        kept: the samples the method's own filter kept (filtering methods).
        stats: numbers the method reports for this batch (logged).

    A task adds what only it knows in a subclass (segmentation: labels at
    the original size, the views of a multi-view pipeline).
    """
    inputs: Any
    forward: Forward
    prediction: Optional[torch.Tensor] = None
    head_outputs: HeadOutputs = ()
    among: Optional[torch.Tensor] = None
    kept: Optional[torch.Tensor] = None
    stats: Dict[str, float] = field(default_factory=dict)


class BaseMethod:
    """Base class of the online-adaptation methods.

    Args:
        stag (dict, optional): ``dict(beta0=..., gamma=..., eps=1e-8,
            anchor='diagonal', label='hard', reset_per_stage=False)`` adds
            ``beta_t * L_STAG`` (:class:`~mmseg_stag.core.STAGLoss`).
            ``reset_per_stage``: restart ``t`` (so ``beta_t = beta0``) when
            the stream's stage changes; the paper's Algorithm 1 never resets
            ``t``. ``None``: STAG off.
        optimizer (dict): an MMEngine ``OPTIMIZERS`` config without params.
            Default: Adam, lr 7.5e-6, betas (0.9, 0.999) (CoTTA's ACDC setup).
        trainable (dict): arguments of :func:`select_parameters`.
        reset_optimizer_per_stage (bool): a fresh optimizer (no moments)
            when the stream's stage changes, as CoTTA's ACDC code does
            (``single_gpu_tent``/``single_gpu_cotta`` build their Adam at
            every call, one call per stage). Default: False.
    """

    #: whether the method has a loss of its own (``L_base``)
    has_base_loss = True
    #: the classifier outputs the method is defined on
    supported_outputs: Tuple[str, ...] = OUTPUT_KINDS
    #: whether :meth:`fit_source` must be given clean source batches
    needs_source_data = False

    def __init__(self,
                 stag: Optional[dict] = None,
                 optimizer: Optional[dict] = None,
                 trainable: Optional[dict] = None,
                 reset_optimizer_per_stage: bool = False):
        self.stag_cfg = None if stag is None else dict(stag)
        self.stag_loss = None
        if self.stag_cfg is not None:
            missing = {'beta0', 'gamma'} - set(self.stag_cfg)
            if missing:
                raise ValueError(f'stag config needs {sorted(missing)}, got '
                                 f'{self.stag_cfg}')
            self.stag_loss = STAGLoss(**{
                k: v for k, v in self.stag_cfg.items()
                if k not in ('beta0', 'gamma', 'type', 'reset_per_stage')})
            stag_beta(self.stag_cfg['beta0'], self.stag_cfg['gamma'], 0)
        self.optimizer_cfg = dict(optimizer or dict(
            type='Adam', lr=7.5e-6, betas=(0.9, 0.999)))
        self.trainable_cfg = dict(trainable or dict(kind='norm_affine'))
        self.reset_beta_per_stage = bool(
            (self.stag_cfg or {}).get('reset_per_stage', False))
        self.reset_optimizer_per_stage = bool(reset_optimizer_per_stage)

        self.model: Optional[nn.Module] = None
        self.classifier: Optional[nn.Module] = None
        self.optimizer = None
        self.params: List[Tuple[str, nn.Parameter]] = []
        self.step = 0  # update steps since the start (or the stage): t
        self.num_updates = 0
        self.stage = None

    @property
    def name(self) -> str:
        return type(self).__name__

    @property
    def updates(self) -> bool:
        """Whether :meth:`adapt` runs a backward pass and an optimizer
        step (so the caller enables gradients)."""
        return self.has_base_loss or self.stag_loss is not None

    @property
    def beta(self) -> float:
        """Current ``beta_t`` (0 without STAG), eq:adaptive_decay."""
        if self.stag_cfg is None:
            return 0.0
        return stag_beta(self.stag_cfg['beta0'], self.stag_cfg['gamma'],
                         self.step)

    # ------------------------------------------------------------------
    def check_output(self, output: str) -> None:
        """Raise a ValueError if the method is not defined on ``output``
        (``'per_sample'`` or ``'per_pixel'``) classifier outputs."""
        if check_output_kind(output) not in self.supported_outputs:
            raise ValueError(
                f'{self.name} supports {" and ".join(self.supported_outputs)}'
                f' outputs only, but this task gives {output} outputs '
                f'(choose another method)')

    def configure(self, model: nn.Module, classifier: nn.Module,
                  output: str = 'per_sample') -> None:
        """Select and unfreeze the adapted parameters, build the optimizer,
        set the layers' modes."""
        self.check_output(output)
        self.model, self.classifier = model, classifier
        for p in model.parameters():
            p.requires_grad_(False)
        self.set_modes(model)
        if not self.updates:
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
            log_anchor_signs(classifier)

    def build_optimizer(self):
        return OPTIMIZERS.build(
            dict(self.optimizer_cfg, params=[p for _, p in self.params]))

    def exclude_modules(self, exclude_regex: Optional[str]) -> None:
        """Freeze the selected parameters whose module name matches
        ``exclude_regex`` and rebuild the optimizer on the others."""
        if exclude_regex is None:
            return
        kept = exclude_by_module(self.params, exclude_regex)
        if not kept:
            raise ValueError(
                f'{self.name}: every parameter of trainable='
                f'{self.trainable_cfg} matches exclude_regex='
                f'{exclude_regex!r}')
        if len(kept) != len(self.params):
            self.params = kept
            self.optimizer = self.build_optimizer()

    def set_modes(self, model: nn.Module) -> None:
        """Train/eval behaviour of the layers (once, in :meth:`configure`)."""
        model.eval()

    def fit_source(self, forward: Forward, batches) -> None:
        """Statistics taken from clean source batches before the stream
        (EATA's Fisher information); nothing by default."""

    def on_stage(self, stage) -> None:
        """Called with each batch's stage tag (``None`` when untagged);
        a new stage restarts ``t`` and/or the optimizer if configured."""
        if stage != self.stage and self.stage is not None:
            if self.reset_beta_per_stage:
                self.step = 0
            if self.reset_optimizer_per_stage and self.optimizer is not None:
                self.optimizer = self.build_optimizer()
        self.stage = stage

    # ------------------------------------------------------------------
    def state_dict(self) -> dict:
        """Everything the rest of a stream depends on: the model's
        parameters and buffers, the optimizer's state, ``t``, the counters
        and the stage; subclasses add their own (teacher, EMA, ...).

        Plain tensors and numbers (``torch.save`` it, read it back with
        ``weights_only=True``); the tensors are the live ones, so save or
        clone before adapting further. What :meth:`configure` and
        :meth:`fit_source` derive from the source model alone is rebuilt by
        them, except where a subclass saves it to skip the work.
        """
        if self.model is None:
            raise RuntimeError(f'{self.name}: configure before state_dict')
        return dict(
            model=self.model.state_dict(),
            optimizer=None if self.optimizer is None
            else self.optimizer.state_dict(),
            step=self.step, num_updates=self.num_updates, stage=self.stage)

    def load_state_dict(self, state: dict) -> None:
        """Continue from :meth:`state_dict` of a method built from the same
        config and configured on the same source model."""
        if self.model is None:
            raise RuntimeError(f'{self.name}: configure before '
                               'load_state_dict')
        self.model.load_state_dict(state['model'])
        if (self.optimizer is None) != (state['optimizer'] is None):
            raise ValueError(f'{self.name}: the saved state was written '
                             'with' + ('out' if state['optimizer'] is None
                                       else '') + ' an optimizer')
        if self.optimizer is not None:
            self.optimizer.load_state_dict(state['optimizer'])
        self.step, self.num_updates = state['step'], state['num_updates']
        self.stage = state['stage']

    # ------------------------------------------------------------------
    def base_loss(self, ctx: BatchContext) -> Optional[torch.Tensor]:
        """``L_base`` of eq:total_objective; ``None``: nothing to minimise
        (a filtering baseline kept no sample)."""
        raise TypeError(f'{self.name} has no loss of its own '
                        '(has_base_loss is False)')

    def stag_term(self, ctx: BatchContext) -> torch.Tensor:
        """``L_STAG`` (eq:stag_batch_loss) over every sample/pixel of the
        batch's head outputs."""
        weight, bias = self.classifier.weight, self.classifier.bias
        return mean_over_outputs(
            lambda f, z: self.stag_loss(f, z, weight, bias), ctx.head_outputs)

    def loss(self, ctx: BatchContext) -> Optional[torch.Tensor]:
        """``L_total = L_base + beta_t L_STAG`` (eq:total_objective).

        ``L_STAG`` covers every sample (pixel), whatever a baseline's own
        filter keeps: it regularises the update, it is not a pseudo-label
        loss. ``None`` when there is nothing to minimise (no kept sample and
        STAG off); numbers go to ``ctx.stats``.
        """
        total = None
        if self.has_base_loss:
            total = self.base_loss(ctx)
            if total is not None:
                ctx.stats['loss_base'] = total.item()
        if self.stag_loss is not None:
            l_stag = self.stag_term(ctx)
            beta = self.beta
            ctx.stats.update(loss_stag=l_stag.item(), beta=beta)
            total = beta * l_stag if total is None else total + beta * l_stag
        if total is not None:
            ctx.stats['loss'] = total.item()
        return total

    def update(self, total: Optional[torch.Tensor]) -> bool:
        """One backward pass and optimizer step on ``total``; advances
        ``t``. Returns whether an update happened."""
        if total is None:
            return False
        self.optimizer.zero_grad(set_to_none=True)
        total.backward()
        self.optimizer.step()
        self.step += 1
        self.num_updates += 1
        return True

    def forward_pass(self, ctx: BatchContext) -> BatchContext:
        """The batch's one forward pass through the probe."""
        ctx.prediction, ctx.head_outputs = ctx.forward(self.model, ctx.inputs)
        return ctx

    def adapt(self, ctx: BatchContext) -> Tuple[torch.Tensor, Dict[str,
                                                                   float]]:
        """Predict, then adapt: one forward, at most one backward.

        Returns:
            ``(prediction, stats)``: the prediction of the forward pass
            (before the update), detached, and the batch's numbers.
        """
        if self.model is None:
            raise RuntimeError(f'{self.name}.configure(model, classifier) '
                               'must be called before adapt')
        self.forward_pass(ctx)
        if self.updates:
            self.update(self.loss(ctx))
        return ctx.prediction.detach(), ctx.stats

    def __repr__(self) -> str:
        stag = 'off' if self.stag_cfg is None else self.stag_cfg
        reset = (', reset_optimizer_per_stage=True'
                 if self.reset_optimizer_per_stage else '')
        return (f'{self.name}(stag={stag}, optimizer={self.optimizer_cfg}, '
                f'trainable={self.trainable_cfg}{reset})')


@torch.no_grad()
def log_anchor_signs(classifier: nn.Module) -> Tuple[int, float, float]:
    """Log how many classes have ``s_k > 0`` (their anchor ``a_k = s_k w_k``
    points away from ``w_k``) and the range of ``s_k``
    (eq:structural_anchor). Returns ``(num_positive, min, max)``."""
    weight = classifier.weight.detach().flatten(1).double()
    bias = None if classifier.bias is None else classifier.bias.detach()
    s = anchor_coefficients(weight, None if bias is None else bias.double())
    positive = int((s > 0).sum())
    lo, hi = float(s.min()), float(s.max())
    print_log(f'STAG anchors: {positive} of {s.numel()} classes have s_k > 0 '
              f'(anchor pointing away from w_k); s_k in [{lo:.4g}, {hi:.4g}]',
              logger='current')
    return positive, lo, hi


class SampleFilteringMethod(BaseMethod):
    """Base of the baselines whose loss keeps samples through two filters
    (EATA, DeYO): counts the kept samples over the stream under the authors'
    names and reports this batch's counts in the stats."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.num_samples_update_1 = 0  # passed the first filter, so far
        self.num_samples_update_2 = 0  # passed both filters, so far

    def state_dict(self) -> dict:
        return dict(super().state_dict(),
                    num_samples_update_1=self.num_samples_update_1,
                    num_samples_update_2=self.num_samples_update_2)

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.num_samples_update_1 = state['num_samples_update_1']
        self.num_samples_update_2 = state['num_samples_update_2']

    def record_selection(self, ctx: BatchContext, reliable: torch.Tensor,
                         selected: torch.Tensor) -> int:
        """Counts one batch's kept samples; returns how many are selected."""
        num_reliable, num_selected = int(reliable.sum()), int(selected.sum())
        self.num_samples_update_1 += num_reliable
        self.num_samples_update_2 += num_selected
        ctx.stats.update(num_reliable=float(num_reliable),
                         num_selected=float(num_selected))
        return num_selected
