"""The interface every TTA method shares, and STAG's place in it.

A method sees only a model, its classifier, and what one forward pass gives:
``head_outputs``, a list of ``(features, logits)`` pairs with the class axis at
dim 1 (``[N, C]`` per sample or ``[N, C, H, W]`` per pixel; several pairs
when a segmentor runs sliding-window crops). The same classes therefore serve
segmentation and classification.

Life cycle (mirrors DequanWang/tent and mariodoebler/test-time-adaptation):

1. ``configure(model, classifier)``: choose the trainable parameters, freeze
   the rest, set the normalisation behaviour, build the optimizer.
2. per batch, ``adapt(forward, inputs)``: one forward pass (with gradients when
   the method updates), ``objective`` = base loss + ``beta_t * L_STAG``, one
   backward, one optimizer step; returns the prediction made by the forward
   pass, i.e. *before* the update (predict-then-adapt).
"""
import re
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn as nn
from mmengine.optim import OPTIMIZERS  # importing it registers torch.optim
from mmseg.registry import MODELS

from mmseg_stag.stag import stag_beta

HeadOutputs = Sequence[Tuple[torch.Tensor, torch.Tensor]]
Forward = Callable[[nn.Module, Any], Tuple[torch.Tensor, HeadOutputs]]

#: Normalisation layer families selectable by name in ``norm_types``.
NORM_LAYER_TYPES = {
    'BN': nn.modules.batchnorm._BatchNorm,
    'LN': nn.LayerNorm,
    'GN': nn.GroupNorm,
    'IN': nn.modules.instancenorm._InstanceNorm,
}


def norm_layers(model: nn.Module,
                norm_types: Sequence[str] = ('BN', 'LN', 'GN', 'IN')
                ) -> List[Tuple[str, nn.Module]]:
    """``(name, module)`` of every normalisation layer of the given types.

    Selection is by module type, not by name: MMSeg's MiT names its
    stage-final LayerNorms ``layers.{i}.2`` (no "norm" in the name).
    """
    unknown = set(norm_types) - set(NORM_LAYER_TYPES)
    if unknown:
        raise ValueError(f'unknown norm_types {sorted(unknown)}; choose from '
                         f'{sorted(NORM_LAYER_TYPES)}')
    classes = tuple(NORM_LAYER_TYPES[t] for t in norm_types)
    return [(name, m) for name, m in model.named_modules()
            if isinstance(m, classes)]


def select_parameters(model: nn.Module,
                      kind: str = 'norm_affine',
                      norm_types: Sequence[str] = ('BN', 'LN', 'GN', 'IN'),
                      name_regex: Optional[str] = None
                      ) -> List[Tuple[str, nn.Parameter]]:
    """The parameters a method adapts, as ``(name, parameter)``.

    Args:
        model: the model.
        kind: ``'norm_affine'`` (weight and bias of the normalisation layers
            of ``norm_types``) or ``'all'``.
        norm_types: families in :data:`NORM_LAYER_TYPES`.
        name_regex: if given, keep only parameters whose full name matches.
    """
    if kind == 'norm_affine':
        selected = [(f'{mod_name}.{p_name}' if mod_name else p_name, p)
                    for mod_name, m in norm_layers(model, norm_types)
                    for p_name, p in m.named_parameters(recurse=False)
                    if p_name in ('weight', 'bias')]
    elif kind == 'all':
        selected = list(model.named_parameters())
    else:
        raise ValueError(
            f"trainable kind must be 'norm_affine' or 'all', got {kind!r}")
    if name_regex is not None:
        pattern = re.compile(name_regex)
        selected = [(n, p) for n, p in selected if pattern.search(n)]
    return selected


def use_batch_statistics(model: nn.Module) -> None:
    """BatchNorm layers normalise with the current batch's statistics.

    As in the BN Adapt baseline (Schneider et al.; tent's ``norm.py``): the
    running statistics are dropped so that evaluation mode cannot bring them
    back.
    """
    for _, m in norm_layers(model, ('BN', )):
        m.track_running_stats = False
        m.running_mean = None
        m.running_var = None
        m.train()


def softmax_entropy(logits: torch.Tensor) -> torch.Tensor:
    """Shannon entropy of ``softmax(logits)`` along dim 1 (eq:ent)."""
    log_p = logits.log_softmax(dim=1)
    return -(log_p.exp() * log_p).sum(dim=1)


def per_sample_logits(head_outputs: HeadOutputs,
                      method: str) -> Tuple[torch.Tensor, torch.Tensor]:
    """``(features [N, D], logits [N, C])`` of a per-sample forward pass,
    concatenated over the pairs, for the methods defined per sample only
    (their filters and weights are per image); raises a ValueError naming
    ``method`` for per-pixel outputs."""
    for _, logits in head_outputs:
        if logits.dim() != 2:
            raise ValueError(
                f'{method} supports per-sample classification outputs only '
                f'(logits [N, C]); got logits of shape '
                f'{tuple(logits.shape)} (per-pixel segmentation outputs are '
                'not supported)')
    if len(head_outputs) == 1:
        return head_outputs[0]
    return (torch.cat([f for f, _ in head_outputs]),
            torch.cat([z for _, z in head_outputs]))


def mean_over_outputs(fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
                      head_outputs: HeadOutputs) -> torch.Tensor:
    """Mean of a per-pair mean loss over all samples/pixels of all pairs.

    ``fn(features, logits)`` returns the mean over one pair; pairs (e.g.
    sliding-window crops) are weighted by their number of samples/pixels.
    """
    sizes = [logits[:, 0].numel() for _, logits in head_outputs]
    total = float(sum(sizes))
    return sum(fn(feats, logits) * (size / total)
               for (feats, logits), size in zip(head_outputs, sizes))


class TTAMethod:
    """Base class of the online TTA methods.

    Args:
        stag (dict, optional): ``dict(beta0=..., gamma=..., eps=1e-8,
            anchor='diagonal', label='hard')`` adds ``beta_t * L_STAG`` to the
            objective (``STAGLoss`` from MMSeg's ``MODELS``). ``None``: off.
        optimizer (dict): an MMEngine ``OPTIMIZERS`` config without params.
            Default: Adam, lr 7.5e-6, betas (0.9, 0.999) (CoTTA's ACDC setup).
        trainable (dict): arguments of :func:`select_parameters`.
        reset_beta_per_stage (bool): restart ``t`` (so ``beta_t = beta0``)
            when a sample's ``stage`` changes. The paper never resets.
    """

    #: whether the method has a loss of its own (``L_base``)
    has_base_loss = True

    def __init__(self,
                 stag: Optional[dict] = None,
                 optimizer: Optional[dict] = None,
                 trainable: Optional[dict] = None,
                 reset_beta_per_stage: bool = False):
        self.stag_cfg = None if stag is None else dict(stag)
        self.stag_loss = None
        if self.stag_cfg is not None:
            missing = {'beta0', 'gamma'} - set(self.stag_cfg)
            if missing:
                raise ValueError(f'stag config needs {sorted(missing)}, got '
                                 f'{self.stag_cfg}')
            loss_cfg = dict(type='STAGLoss')
            loss_cfg.update({k: v for k, v in self.stag_cfg.items()
                             if k not in ('beta0', 'gamma')})
            self.stag_loss = MODELS.build(loss_cfg)
            stag_beta(self.stag_cfg['beta0'], self.stag_cfg['gamma'], 0)
        self.optimizer_cfg = dict(optimizer or dict(
            type='Adam', lr=7.5e-6, betas=(0.9, 0.999)))
        self.trainable_cfg = dict(trainable or dict(kind='norm_affine'))
        self.reset_beta_per_stage = reset_beta_per_stage

        self.model: Optional[nn.Module] = None
        self.classifier: Optional[nn.Module] = None
        self.optimizer = None
        self.params: List[Tuple[str, nn.Parameter]] = []
        self.step = 0  # update steps since the start (or the stage)
        self.num_updates = 0
        self.stage = None
        self.last_stats: Dict[str, float] = {}

    # ------------------------------------------------------------------
    @property
    def updates(self) -> bool:
        """Whether ``adapt`` runs a backward pass and an optimizer step."""
        return self.has_base_loss or self.stag_loss is not None

    @property
    def beta(self) -> float:
        """Current ``beta_t`` (0 without STAG)."""
        if self.stag_cfg is None:
            return 0.0
        return stag_beta(self.stag_cfg['beta0'], self.stag_cfg['gamma'],
                         self.step)

    def configure(self, model: nn.Module, classifier: nn.Module) -> None:
        """Select and unfreeze the adapted parameters, build the optimizer."""
        self.model, self.classifier = model, classifier
        for p in model.parameters():
            p.requires_grad_(False)
        if not self.updates:
            self.params = []
            return
        self.params = select_parameters(model, **self.trainable_cfg)
        if not self.params:
            raise ValueError(
                f'{type(self).__name__}: no parameter matches trainable='
                f'{self.trainable_cfg}')
        for _, p in self.params:
            p.requires_grad_(True)
        self.optimizer = OPTIMIZERS.build(
            dict(self.optimizer_cfg, params=[p for _, p in self.params]))

    def exclude_modules(self, exclude_regex: Optional[str]) -> None:
        """Freeze the selected parameters whose module name matches
        ``exclude_regex`` (substring search, as the authors' SAR/DeYO
        ``collect_params``) and rebuild the optimizer on the others."""
        if exclude_regex is None:
            return
        pattern = re.compile(exclude_regex)
        kept = []
        for name, p in self.params:
            module_name = name.rsplit('.', 1)[0] if '.' in name else ''
            if pattern.search(module_name):
                p.requires_grad_(False)
            else:
                kept.append((name, p))
        if not kept:
            raise ValueError(
                f'{type(self).__name__}: every parameter of trainable='
                f'{self.trainable_cfg} matches exclude_regex='
                f'{exclude_regex!r}')
        if len(kept) != len(self.params):
            self.params = kept
            self.optimizer = OPTIMIZERS.build(
                dict(self.optimizer_cfg, params=[p for _, p in kept]))

    def set_modes(self, model: nn.Module) -> None:
        """Train/eval behaviour of the layers; called before every forward
        because MMEngine's test loop puts the model in eval mode."""
        model.eval()

    def base_loss(self, head_outputs: HeadOutputs) -> torch.Tensor:
        """``L_base`` of eq:total_objective."""
        raise TypeError(f'{type(self).__name__} has no loss of its own '
                        '(has_base_loss is False)')

    def objective(self, head_outputs: HeadOutputs
                  ) -> Tuple[Optional[torch.Tensor], Dict[str, float]]:
        """``L_total = L_base + beta_t L_STAG`` (eq:total_objective).

        ``L_STAG`` covers every sample (pixel) of the forward pass, whatever
        a baseline's own sample filter keeps: it is a regulariser of the
        update, not a pseudo-label loss. Returns ``(None, stats)`` when
        there is nothing to minimise (a filtering baseline kept no sample
        and STAG is off); ``adapt`` then skips the update, as the
        baselines' own code does.
        """
        stats = {}
        total = None
        if self.has_base_loss:
            total = self.base_loss(head_outputs)
            if total is not None:
                stats['loss_base'] = total.item()
        if self.stag_loss is not None:
            weight, bias = self.classifier.weight, self.classifier.bias
            l_stag = mean_over_outputs(
                lambda f, z: self.stag_loss(f, z, weight, bias), head_outputs)
            beta = self.beta
            stats.update(loss_stag=l_stag.item(), beta=beta)
            total = beta * l_stag if total is None else total + beta * l_stag
        if total is not None:
            stats['loss'] = total.item()
        return total, stats

    def minimise(self, total: Optional[torch.Tensor]) -> bool:
        """One backward pass and optimizer step on ``total``; advances
        ``t``. Returns whether an update happened (``total`` not None)."""
        if total is None:
            return False
        self.optimizer.zero_grad(set_to_none=True)
        total.backward()
        self.optimizer.step()
        self.step += 1
        self.num_updates += 1
        return True

    def fit_source(self, forward: Forward, batches) -> None:
        """Statistics a method takes from clean source-domain batches before
        the test stream (EATA's Fisher information). ``needs_source_data``
        says whether a method wants them; the default does nothing."""

    #: whether :meth:`fit_source` must be given clean batches
    needs_source_data = False

    def on_stage(self, stage) -> None:
        """Called with each batch's stage tag (``None`` when untagged)."""
        if stage != self.stage and self.stage is not None and \
                self.reset_beta_per_stage:
            self.step = 0
        self.stage = stage

    def adapt(self, forward: Forward, inputs: Any) -> torch.Tensor:
        """Predict, then adapt, with one forward and at most one backward.

        Args:
            forward: ``forward(model, inputs) -> (prediction, head_outputs)``
                runs ``model`` once. Methods that need another model (a
                teacher) or other inputs (augmented views) call it again
                with those; the base methods call it exactly once.
            inputs: the batch.

        Returns:
            The prediction from that forward pass (before the update),
            detached.
        """
        if self.model is None:
            raise RuntimeError(f'{type(self).__name__}.configure(model, '
                               'classifier) must be called before adapt')
        self.set_modes(self.model)
        if not self.updates:
            with torch.no_grad():
                prediction, _ = forward(self.model, inputs)
            self.last_stats = {}
            return prediction
        with torch.enable_grad():
            prediction, head_outputs = forward(self.model, inputs)
            total, stats = self.objective(head_outputs)
            self.minimise(total)
        self.last_stats = stats
        return prediction.detach()

    def adapt_and_predict(self, model: nn.Module, inputs: torch.Tensor,
                          batch_img_metas: List[dict]) -> torch.Tensor:
        """Segmentation entry point called by ``TTAEncoderDecoder.predict``.

        Returns the segmentor's ``seg_logits`` for ``postprocess_result``.
        """
        if model is not self.model:
            raise RuntimeError('adapt_and_predict got another model than the '
                               'one the method was configured with')
        stages = {meta.get('stage') for meta in batch_img_metas}
        if len(stages) > 1:
            raise ValueError(f'a batch spans several stages {sorted(stages)}; '
                             'use batch size 1 or stage-aligned batches')
        self.on_stage(stages.pop() if stages else None)
        return self.adapt(
            lambda m, x: m.inference_with_features(x, batch_img_metas),
            inputs)

    def __repr__(self) -> str:
        stag = 'off' if self.stag_cfg is None else self.stag_cfg
        return (f'{type(self).__name__}(stag={stag}, '
                f'optimizer={self.optimizer_cfg}, '
                f'trainable={self.trainable_cfg})')


class SampleFilteringMethod(TTAMethod):
    """Base of the baselines whose loss keeps samples through two filters
    (EATA, DeYO): counts the kept samples over the stream under the authors'
    names and reports this step's counts in the stats."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.num_samples_update_1 = 0  # passed the first filter, so far
        self.num_samples_update_2 = 0  # passed both filters, so far
        self._select_stats: Dict[str, float] = {}

    def record_selection(self, reliable: torch.Tensor,
                         selected: torch.Tensor) -> int:
        """Counts one batch's kept samples; returns how many are selected."""
        num_reliable, num_selected = int(reliable.sum()), int(selected.sum())
        self.num_samples_update_1 += num_reliable
        self.num_samples_update_2 += num_selected
        self._select_stats = dict(num_reliable=float(num_reliable),
                                  num_selected=float(num_selected))
        return num_selected

    def objective(self, head_outputs):
        self._select_stats = {}
        total, stats = super().objective(head_outputs)
        stats.update(self._select_stats)
        return total, stats
