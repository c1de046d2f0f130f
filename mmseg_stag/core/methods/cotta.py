"""CoTTA (Wang et al., CVPR 2022): continual test-time adaptation."""
import copy
from abc import ABC, abstractmethod
from typing import Dict, List, Optional, Tuple

import torch
import torch.nn as nn

from ..losses import (cross_entropy_to_teacher, flatten_outputs,
                      symmetric_cross_entropy)
from ..registry import METHODS, check_range
from ..task_adapter import (Batch, ForwardPass, Logits, PassStats, Prediction,
                            StepStats)
from .base import BaseMethod
from .cotta_transforms import CoTTAAugment, cotta_augment_params


@torch.no_grad()
def ema_update_(teacher: nn.Module, student: nn.Module, a: float) -> None:
    """``theta_t <- a theta_t + (1 - a) theta_s`` over every parameter."""
    ema = list(teacher.parameters())
    # the same roundings as a * ema + (1 - a) * param, for all at once
    mixed = torch._foreach_add(torch._foreach_mul(ema, a),
                               torch._foreach_mul(list(student.parameters()),
                                                  1 - a))
    torch._foreach_copy_(ema, mixed)


class CoTTABase(BaseMethod, ABC):
    """What the classification and the segmentation CoTTA share: a student
    trained on an EMA teacher's prediction, a frozen source model, the
    stochastic restore and the step; not registered.

    A subclass gives the teacher's prediction (:meth:`teacher_prediction`)
    and the student's loss to it (:meth:`loss_to_teacher`), and takes only
    the options it uses: an option of the other CoTTA is refused at build
    time, not accepted and ignored.

    Args:
        ema_momentum (float): ``a`` of the teacher update. Default: 0.999.
        restore_prob (float): Per-element restore probability.
            Default: 0.01.
        ap (float): The source model's confidence threshold. Default: 0.92.
        restore_on_device (bool): Draw the restore mask on the parameters'
            device, in one call for all of them (default False: the
            authors' per-tensor draw on the CPU, copied to the device).
        **kwargs: :class:`BaseMethod`'s arguments.

    Raises:
        ValueError: If an argument is out of range.
    """

    default_optimizer = dict(type='Adam', lr=1e-3, betas=(0.9, 0.999))
    default_trainable = dict(kind='all')
    # the source model and the restore targets come from configure
    state_attributes = ('teacher', )

    def __init__(self,
                 ema_momentum: float = 0.999,
                 restore_prob: float = 0.01,
                 ap: float = 0.92,
                 restore_on_device: bool = False,
                 **kwargs):
        check_range('in [0, 1]', ema_momentum=ema_momentum,
                    restore_prob=restore_prob)
        super().__init__(**kwargs)
        self.ema_momentum = float(ema_momentum)
        self.restore_prob = float(restore_prob)
        self.ap = float(ap)
        self.restore_on_device = bool(restore_on_device)
        if self.restore_on_device and self.restore_prob <= 0:
            raise ValueError('cotta restore_on_device=True draws the restore '
                             'mask on the device, and restore_prob='
                             f'{restore_prob} restores nothing: remove one')

        self.teacher: Optional[nn.Module] = None
        self.source_model: Optional[nn.Module] = None
        self.source_params: Dict[str, torch.Tensor] = {}
        self.restore_params: List[Tuple[str, nn.Parameter]] = []

    def configure(self, model, task_adapter):
        super().configure(model, task_adapter)
        # CoTTA's copy_model_and_optimizer, after configure_model
        self.teacher = copy.deepcopy(model).requires_grad_(False)
        self.source_model = copy.deepcopy(model).requires_grad_(False)
        self.restore_params = [
            (name, p) for name, p in model.named_parameters()
            if p.requires_grad and name.rsplit('.', 1)[-1] in ('weight',
                                                               'bias')]
        self.source_params = {name: p.detach().clone()
                              for name, p in self.restore_params}

    @abstractmethod
    def teacher_prediction(self, batch: Batch,
                           stats: PassStats) -> Prediction:
        """Return the teacher's prediction the student is trained on (and
        the step returns); log the method's numbers into ``stats``."""

    @abstractmethod
    def loss_to_teacher(self, student: ForwardPass,
                        teacher: Prediction) -> torch.Tensor:
        """Return the student's loss to the teacher's prediction."""

    def update_teacher(self) -> None:
        """Update the teacher: ``theta_t <- a theta_t + (1 - a) theta_s``."""
        ema_update_(self.teacher, self.model, self.ema_momentum)

    @torch.no_grad()
    def stochastic_restore(self) -> None:
        """Restore each element to its source value w.p. ``restore_prob``."""
        if self.restore_prob <= 0:
            return
        if not self.restore_on_device:
            for name, p in self.restore_params:
                mask = (torch.rand(p.shape) < self.restore_prob).to(p)
                p.copy_(self.source_params[name] * mask + p * (1. - mask))
            return
        # restore_on_device: one draw on the device for all parameters
        params = [p for _, p in self.restore_params]
        draw = torch.rand(sum(p.numel() for p in params),
                          device=params[0].device) < self.restore_prob
        masks = [m.view_as(p).to(p.dtype)
                 for m, p in zip(draw.split([p.numel() for p in params]),
                                 params)]
        # lerp with weight 0 or 1 gives the parameter or the source exactly
        torch._foreach_lerp_(params, [self.source_params[n]
                                      for n, _ in self.restore_params], masks)

    def forward_and_adapt(self, batch: Batch, beta=None):
        """The step: student, teacher, one update, EMA, restore; the
        teacher's prediction is returned (as CoTTA.forward_and_adapt
        returns outputs_ema). ``BaseMethod.adapt`` runs and counts it."""
        student = self.task_adapter.forward(self.model, batch)
        teacher = self.teacher_prediction(batch, student.stats)
        self.backward_step(self.add_stag(
            self.loss_to_teacher(student, teacher), student, beta))
        self.update_teacher()
        self.stochastic_restore()
        return teacher, StepStats([student.stats])

    def __repr__(self) -> str:
        return (super().__repr__()[:-1] +
                f', ema_momentum={self.ema_momentum}, '
                f'restore_prob={self.restore_prob}, ap={self.ap}, '
                f'restore_on_device={self.restore_on_device})')


@METHODS.register_module(name='cotta')
class CoTTA(CoTTABase):
    """CoTTA: a student trained on an EMA teacher, with stochastic restore.

    Follows CoTTA's cifar/cotta.py (CoTTA.forward_and_adapt); the options,
    their defaults and the deviations: docs/methods.md (CoTTA). The
    teacher's augmentations (``num_augs``, ``augment``,
    ``always_augment``) and ``loss`` are this classification CoTTA's; the
    segmentation task's (``SegmentationCoTTA``) has none of them.
    ``**kwargs``: :class:`CoTTABase`'s arguments (``ema_momentum``,
    ``restore_prob``, ``ap``, ``restore_on_device``) and
    :class:`BaseMethod`'s.

    Raises:
        ValueError: If an argument is out of range.
    """

    supported_prediction_kinds = ('per_sample', )

    #: the per-sample losses of option ``loss`` (CIFAR, ImageNet code)
    LOSSES = dict(ce=cross_entropy_to_teacher,
                  symmetric_ce=symmetric_cross_entropy)

    def __init__(self,
                 num_augs: int = 32,
                 augment: Optional[dict] = None,
                 always_augment: bool = False,
                 loss: str = 'ce',
                 **kwargs):
        if loss not in self.LOSSES:
            raise ValueError(f'cotta loss must be one of '
                             f'{tuple(self.LOSSES)}, got {loss!r}')
        if int(num_augs) != num_augs or num_augs < 0:
            raise ValueError(f'num_augs must be an integer >= 0, got '
                             f'{num_augs}')
        super().__init__(**kwargs)
        self.num_augs = int(num_augs)
        self.always_augment = bool(always_augment)
        self.loss_type = loss
        aug_args = dict(augment or {})
        preset = cotta_augment_params(
            soft=bool(aug_args.pop('soft', False)),
            gaussian_std=aug_args.pop('gaussian_std', 0.005))
        preset.update(aug_args)
        self.augment = CoTTAAugment(**preset)

    def loss_to_teacher(self, student: ForwardPass,
                        teacher: Prediction) -> torch.Tensor:
        """Return the student's loss to the teacher's prediction."""
        _, logits = flatten_outputs(student.head_outputs)
        return self.LOSSES[self.loss_type](logits, teacher.value).mean(0)

    @torch.no_grad()
    def teacher_prediction(self, batch: Batch,
                           stats: PassStats) -> Prediction:
        """Return the teacher's logits (augmented if unsure); log stats."""
        forward = self.task_adapter.forward
        source_logits = forward(self.source_model, batch).output
        source_prob = source_logits.softmax(1).max(1)[0]
        standard_ema = forward(self.teacher, batch).output
        use_augs = self.num_augs > 0 and bool(source_prob.mean(0) < self.ap)
        if self.num_augs > 0 and (use_augs or self.always_augment):
            outputs = [forward(self.teacher, batch,
                               self.augment(batch.inputs)).output.detach()
                       for _ in range(self.num_augs)]
        teacher = torch.stack(outputs).mean(0) if use_augs else standard_ema
        stats.extra.update(source_prob=source_prob.mean().detach(),
                           augmented=float(use_augs))
        return Logits(teacher.detach())

    def __repr__(self) -> str:
        return (super().__repr__()[:-1] +
                f', loss={self.loss_type!r}, num_augs={self.num_augs}, '
                f'always_augment={self.always_augment}, '
                f'augment={self.augment})')
