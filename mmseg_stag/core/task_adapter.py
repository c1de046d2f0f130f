"""What a method may ask of its task: a batch and named operations on it."""
from dataclasses import dataclass, field
from typing import Any, Optional, Union

import torch
import torch.nn as nn

from .probe import HeadOutputs, HeadProbe
from .stats import PassStats


@dataclass
class Batch:
    """One preprocessed batch: the model's ``inputs`` (e.g. images
    ``[N, 3, H, W]``) and the task's ``data_samples``."""
    inputs: Any
    data_samples: Optional[list] = None


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


class TaskAdapter:
    """The per-sample task's operations: the forward pass of ``probe``.

    What a task can do for a method is its :attr:`prediction_kind` and
    whether it :attr:`has_original_size` (``BaseMethod.check_supports``).
    """

    #: whether it gives logits, labels and a loss at each image's original
    #: size (``SegmentationAdapter``), which a method may need (its
    #: ``needs_original_size``)
    has_original_size: bool = False

    def __init__(self, probe: HeadProbe):
        self.probe = probe

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
        logits, head_outputs = self.probe(
            model, batch.inputs if inputs is None else inputs)
        return ForwardPass(logits, head_outputs)
