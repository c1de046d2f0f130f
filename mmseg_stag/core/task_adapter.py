"""What a method's step takes and gives, and what it may ask of its task.

A step takes a :class:`Batch`; each forward pass is a :class:`ForwardPass`
with the :class:`PassStats` the method logs on it; ``adapt`` gives its
prediction (:class:`Logits` or :class:`Labels`) and a :class:`StepStats`,
which the loop reads at the logger's interval and at every stage's end,
stopping the run on a non-finite value (:class:`NonFiniteStatistic`). A
:class:`TaskAdapter` holds the task's named operations on a batch.
"""
from abc import abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import (Any, Callable, Dict, Iterator, List, Optional, Sequence,
                    Union)

import torch
import torch.nn as nn

from .probe import HeadOutputs, HeadProbe, run_probe


@dataclass
class Batch:
    """One preprocessed batch: the model's ``inputs`` (e.g. images
    ``[N, 3, H, W]``) and the task's ``data_samples``."""
    inputs: Any
    data_samples: Optional[list] = None


#: a float, or a 0-d tensor read later (reading waits for the device)
Stat = Any

#: the loss terms of a pass, in the order they are logged
LOSS_TERMS = ('loss_base', 'loss_stag', 'beta', 'loss')


class Logged(Mapping):
    """Read-only mapping of a record's logged names (its ``logged()``)."""

    @abstractmethod
    def logged(self) -> Dict[str, Stat]:
        """Every value by its logged name."""

    def __getitem__(self, key: str) -> Stat:
        return self.logged()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.logged())

    def __len__(self) -> int:
        return len(self.logged())


@dataclass
class PassStats(Logged):
    """One forward pass: its loss terms (eq:total_objective: ``L_base``,
    ``L_STAG``, ``beta_t`` and their sum) and the method's own numbers
    (``extra``: kept samples, a regulariser, ...); read as a mapping of the
    logged names (``fwd.stats['num_kept']``)."""
    loss_base: Optional[Stat] = None
    loss_stag: Optional[Stat] = None
    beta: Optional[Stat] = None
    loss: Optional[Stat] = None
    extra: Dict[str, Stat] = field(default_factory=dict)

    def logged(self, suffix: str = '') -> Dict[str, Stat]:
        """The set values by logged name (``suffix`` after each)."""
        out = {k + suffix: v for k, v in self.extra.items()}
        out.update((k + suffix, getattr(self, k)) for k in LOSS_TERMS
                   if getattr(self, k) is not None)
        return out

    def map(self, fn: Callable[[Stat], Stat]) -> 'PassStats':
        """A copy with ``fn`` applied to every set value."""
        terms = {k: None if getattr(self, k) is None else fn(getattr(self, k))
                 for k in LOSS_TERMS}
        return PassStats(extra={k: fn(v) for k, v in self.extra.items()},
                         **terms)


@dataclass
class ForwardPass:
    """One forward pass of a batch and the numbers a method logs on it.

    ``output``: what the batch is scored on, per sample the classifier's
    logits, per pixel the segmentor's (MMSeg's ``seg_logits`` at the input
    size); ``head_outputs``: the classifier's ``[(features, logits), ...]``,
    one pair per call.
    """
    output: torch.Tensor
    head_outputs: HeadOutputs
    stats: PassStats = field(default_factory=PassStats)
    #: the task's post-processed data samples of ``output``, once made
    #: (segmentation: ``SegmentationAdapter.postprocessed``)
    postprocessed: Optional[list] = field(default=None, repr=False)


@dataclass(frozen=True)
class Logits:
    """A method's prediction as the batch's logits (``ForwardPass.output``),
    which the task turns into its outputs (segmentation: resized to each
    image's original size); ``postprocessed``: their post-processed data
    samples, where the method's loss made them already."""
    value: torch.Tensor
    postprocessed: Optional[list] = field(default=None, repr=False)


@dataclass(frozen=True)
class Labels:
    """A method's prediction as labels at each image's original size,
    ``[N, H0, W0]`` (segmentation CoTTA's multi-view teacher,
    Hybrid-TTA's teacher)."""
    value: torch.Tensor


#: what :meth:`BaseMethod.adapt` returns as its prediction
Prediction = Union[Logits, Labels]


@dataclass
class StepStats(Logged):
    """One step: its ``passes`` and its own numbers (``extra``); read as a
    mapping of the logged names (``stats['loss_stag']``), the passes'
    numbered (``loss1``, ``loss2``) where there are several or
    ``numbered`` (SAR, whose second pass may not run). ``updated``: whether
    the step applied an optimizer step (counted as ``t`` of ``beta_t``), a
    bool or, under fp16, a 0-d device bool tensor; set by
    ``BaseMethod``'s ``counts_updates`` around every ``forward_and_adapt``
    (docs/methods.md, "Counted updates")."""
    passes: List[PassStats]
    extra: Dict[str, Stat] = field(default_factory=dict)
    numbered: bool = False
    updated: Any = None

    def suffixes(self) -> List[str]:
        if len(self.passes) > 1 or self.numbered:
            return [str(i + 1) for i in range(len(self.passes))]
        return [''] * len(self.passes)

    def logged(self) -> Dict[str, Stat]:
        """Every value by its logged name."""
        out = {}
        for p, s in zip(self.passes, self.suffixes()):
            out.update(p.logged(s))
        out.update(self.extra)
        return out

    def map(self, fn: Callable[[Stat], Stat]) -> 'StepStats':
        """A copy with ``fn`` applied to every value."""
        return StepStats([p.map(fn) for p in self.passes],
                         {k: fn(v) for k, v in self.extra.items()},
                         self.numbered, self.updated)


class NonFiniteStatistic(ValueError):
    """A step's statistic (a loss, a loss term, a method's number) is nan
    or inf: the run stops before it writes anything that includes it."""

    def __init__(self, statistic: str, value: float,
                 batch: Optional[int] = None, method: Optional[str] = None,
                 images: Optional[Sequence[str]] = None):
        self.statistic, self.value, self.batch = statistic, value, batch
        self.method, self.images = method, images
        super().__init__(self.describe())

    def locate(self, batch: int, method: str,
               images: Optional[Sequence[str]]) -> 'NonFiniteStatistic':
        """The same error, placed in the stream."""
        return NonFiniteStatistic(self.statistic, self.value, batch, method,
                                  images)

    def describe(self) -> str:
        who = f'{self.method}: ' if self.method else ''
        where = '' if self.batch is None else f' at batch {self.batch}'
        if self.images:
            shown = ', '.join(self.images[:4]) + (
                f' and {len(self.images) - 4} more'
                if len(self.images) > 4 else '')
            where += f' (image {shown})'
        why = ('the STAG loss is not finite (its features, logits or the '
               'classifier contain nan or inf values)'
               if self.statistic.startswith('loss_stag') else
               'the step is not finite (a learning rate too high for this '
               'stream, a diverged model, or an image with nan or inf values)')
        return (f'{who}{self.statistic} is {self.value}{where}: {why}. The '
                'run stops before it writes any result or run state that '
                "includes this step; --resume continues from the last "
                "stage's end, whose state was finite")


class TaskAdapter:
    """The per-sample task's operations: the forward pass of ``probe``.

    What a task can do for a method is its :attr:`prediction_kind` and
    whether it :attr:`has_original_size` (``BaseMethod.check_supports``).
    Its :attr:`autocast_dtype` (the loop's ``mixed_precision``) runs each
    forward pass, and only the forward pass, under ``torch.autocast``
    (:func:`~.probe.run_probe`).
    """

    #: whether it gives logits, labels and a loss at each image's original
    #: size (``SegmentationAdapter``), which a method may need (its
    #: ``needs_original_size``)
    has_original_size: bool = False

    def __init__(self, probe: HeadProbe,
                 autocast_dtype: Optional[torch.dtype] = None):
        self.probe = probe
        self.autocast_dtype = autocast_dtype

    @property
    def prediction_kind(self) -> str:
        """``'per_sample'`` or ``'per_pixel'``."""
        return self.probe.prediction_kind

    def classifier(self, model: nn.Module) -> nn.Module:
        """The classifier (head layer) of ``model``."""
        return self.probe.classifier(model)

    def forward(self, model: nn.Module, batch: Batch,
                inputs: Any = None) -> ForwardPass:
        """Run ``model`` once on the batch, or on ``inputs`` made from it."""
        logits, head_outputs = run_probe(
            self.probe, model, batch.inputs if inputs is None else inputs,
            autocast_dtype=self.autocast_dtype)
        return ForwardPass(logits, head_outputs)

