"""CoTTA (Wang et al., CVPR 2022): continual test-time adaptation.

Follows the authors' CIFAR code (github.com/qinenergy/cotta,
``cifar/cotta.py`` ``CoTTA.forward_and_adapt``, ``update_ema_variables``,
``copy_model_and_optimizer``; ``cifar/my_transforms.py``; the defaults of
``cifar/cfgs/cifar10/cotta.yaml``); ``loss='symmetric_ce'`` gives the loss of
their ImageNet code (``imagenet/cotta.py``). Per pixel, their ACDC code:
``mmseg_stag.segmentation.SegmentationCoTTA``.
"""
import copy
from typing import Dict, List, Optional, Tuple

import torch
import torch.nn as nn

from ..losses import (cross_entropy_to_teacher, per_sample_logits,
                      symmetric_cross_entropy)
from ..registry import METHODS
from .base import BaseMethod, BatchContext
from .cotta_transforms import CoTTAAugment, cotta_augment_params


@METHODS.register_module(name='cotta')
class CoTTA(BaseMethod):
    """CoTTA: a student trained on an EMA teacher's (augmentation-averaged)
    pseudo-labels, with stochastic restore of the source weights.

    ``configure`` (after selecting the trainable parameters) copies the
    configured model (``copy.deepcopy``) into the EMA teacher and the
    source model (frozen; the authors' ``model_anchor``), and keeps the
    source values of the parameters for the restore.

    One ``adapt`` call (authors' ``forward_and_adapt``):

    1. student forward with gradients; source-model forward (no
       gradients): ``source_prob`` = max softmax probability per sample; teacher
       forward: ``standard_ema``;
    2. if ``source_prob.mean() < ap`` (and ``num_augs > 0``): the teacher
       prediction is the mean of the teacher's logits on ``num_augs``
       augmented batches (:class:`~.cotta_transforms.CoTTAAugment`); otherwise
       ``standard_ema``;
    3. ``L_base = mean_n -sum_c softmax(teacher)_c log_softmax(student)_c``
       (``loss='ce'``, the CIFAR code) or the mean of the cross-entropies
       both ways (``loss='symmetric_ce'``, the ImageNet code), ``+ beta_t
       L_STAG`` on the student's forward; backward; optimizer step;
    4. teacher update ``theta_t <- a theta_t + (1 - a) theta_s`` for every
       parameter (not the buffers, as the authors);
    5. stochastic restore: for every trainable parameter named ``weight``/
       ``bias``, in ``named_parameters`` order, ``mask = torch.rand(shape)
       < restore_prob`` (CPU, global generator) and
       ``theta <- theta_source * mask + theta * (1 - mask)``.

    Returns the teacher prediction of step 2 (detached): CoTTA evaluates
    the teacher. The student/source-model/teacher forwards all use the
    ``forward`` callable (which looks the classifier up by name).

    Random draws per call, in order (global generator): the augmentations
    (``num_augs`` calls, only when the augmentation branch is taken, or
    always with ``always_augment``), then one restore mask per restored
    parameter (none when ``restore_prob <= 0``).

    The default augmentations expect images in ``[0, 1]`` (the authors'
    RobustBench CIFAR models normalise inside the model); for normalised
    inputs pass ``augment=dict(mean=..., std=...)``.

    Args:
        ema_momentum (float): ``a`` of the teacher update. Default: 0.999.
        restore_prob (float): restore probability per element.
            Default: 0.01.
        ap (float): threshold on the source model's mean confidence below which
            the augmentation-averaged prediction is used. Default: 0.92
            (CIFAR-10; the authors use 0.72 for CIFAR-100).
        num_augs (int): augmented teacher forwards (0: never augment).
            Default: 32.
        augment (dict, optional): arguments of
            :class:`~.cotta_transforms.CoTTAAugment`, over the authors'
            ``get_tta_transforms(gaussian_std=0.005, soft=False)``; the
            extra keys ``soft`` and ``gaussian_std`` select that function's
            presets.
        always_augment (bool): run the ``num_augs`` augmented forwards on
            every batch even when their mean is not used, as the authors'
            code does (same random stream as theirs, 32 wasted forwards on
            confident batches). Default: False (only when used).
        optimizer (dict): default Adam lr 1e-3, betas (0.9, 0.999) (the
            authors' CIFAR configs).
        trainable (dict): default ``dict(kind='all')`` (every parameter).
        loss (str): the student's loss to the (detached) teacher
            prediction, per sample, averaged: ``'ce'`` (the authors' CIFAR
            ``softmax_entropy``, ``-sum p_t log p_s``) or ``'symmetric_ce'``
            (their ImageNet ``softmax_entropy``, ``-0.5 sum p_t log p_s
            - 0.5 sum p_s log p_t``). Default: ``'ce'``.
        **kwargs: see :class:`BaseMethod` (``stag``, ...).
    """

    supported_outputs = ('per_sample', )

    #: per-sample student-to-teacher losses (CIFAR, ImageNet code)
    LOSSES = dict(ce=cross_entropy_to_teacher,
                  symmetric_ce=symmetric_cross_entropy)

    def __init__(self,
                 ema_momentum: float = 0.999,
                 restore_prob: float = 0.01,
                 ap: float = 0.92,
                 num_augs: int = 32,
                 augment: Optional[dict] = None,
                 always_augment: bool = False,
                 optimizer: Optional[dict] = None,
                 trainable: Optional[dict] = None,
                 loss: str = 'ce',
                 **kwargs):
        if loss not in self.LOSSES:
            raise ValueError(f'cotta loss must be one of '
                             f'{tuple(self.LOSSES)}, got {loss!r}')
        if not 0.0 <= ema_momentum <= 1.0:
            raise ValueError(
                f'ema_momentum must be in [0, 1], got {ema_momentum}')
        if not 0.0 <= restore_prob <= 1.0:
            raise ValueError(
                f'restore_prob must be in [0, 1], got {restore_prob}')
        if int(num_augs) != num_augs or num_augs < 0:
            raise ValueError(f'num_augs must be an integer >= 0, got '
                             f'{num_augs}')
        super().__init__(
            optimizer=optimizer or dict(type='Adam', lr=1e-3,
                                        betas=(0.9, 0.999)),
            trainable=trainable or dict(kind='all'),
            **kwargs)
        self.ema_momentum = float(ema_momentum)
        self.restore_prob = float(restore_prob)
        self.ap = float(ap)
        self.num_augs = int(num_augs)
        self.always_augment = bool(always_augment)
        self.loss_type = loss
        self.augment_cfg = dict(augment or {})
        aug_args = dict(self.augment_cfg)
        preset = cotta_augment_params(
            soft=bool(aug_args.pop('soft', False)),
            gaussian_std=aug_args.pop('gaussian_std', 0.005))
        preset.update(aug_args)
        self.augment = CoTTAAugment(**preset)

        self.teacher: Optional[nn.Module] = None
        self.source_model: Optional[nn.Module] = None
        self.source_params: Dict[str, torch.Tensor] = {}
        self.restore_params: List[Tuple[str, nn.Parameter]] = []

    def configure(self, model, classifier, output='per_sample'):
        super().configure(model, classifier, output)
        # the authors' copy_model_and_optimizer, after configure_model
        self.teacher = copy.deepcopy(model)
        self.source_model = copy.deepcopy(model)
        for copy_ in (self.teacher, self.source_model):
            for p in copy_.parameters():
                p.requires_grad_(False)
        self.restore_params = [
            (name, p) for name, p in model.named_parameters()
            if p.requires_grad and name.rsplit('.', 1)[-1] in ('weight',
                                                               'bias')]
        self.source_params = {name: p.detach().clone()
                              for name, p in self.restore_params}

    def state_dict(self) -> dict:
        # the source model and the restore targets come from configure
        return dict(super().state_dict(), teacher=self.teacher.state_dict())

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.teacher.load_state_dict(state['teacher'])

    # ------------------------------------------------------------------
    def base_loss(self, ctx: BatchContext) -> torch.Tensor:
        """Mean ``loss`` (cross-entropy or symmetric cross-entropy) of the
        student to the teacher's prediction of the batch, which becomes
        ``ctx.prediction`` (CoTTA evaluates the teacher)."""
        _, logits = per_sample_logits(ctx.head_outputs, 'CoTTA')
        teacher, stats = self.teacher_prediction(ctx.forward, ctx.inputs)
        ctx.prediction = teacher
        ctx.stats.update(stats)
        return self.LOSSES[self.loss_type](logits, teacher).mean(0)

    @torch.no_grad()
    def teacher_prediction(self, forward, inputs
                           ) -> Tuple[torch.Tensor, Dict[str, float]]:
        """Steps 1-2 for the teacher: ``(teacher logits, stats)``."""
        source_logits, _ = forward(self.source_model, inputs)
        source_prob = source_logits.softmax(1).max(1)[0]
        standard_ema, _ = forward(self.teacher, inputs)
        use_augs = self.num_augs > 0 and bool(source_prob.mean(0) < self.ap)
        outputs = None
        if self.num_augs > 0 and (use_augs or self.always_augment):
            outputs = [forward(self.teacher, self.augment(inputs))[0].detach()
                       for _ in range(self.num_augs)]
        if use_augs:
            teacher = torch.stack(outputs).mean(0)
        else:
            teacher = standard_ema
        stats = dict(source_prob=source_prob.mean().item(),
                     augmented=float(use_augs))
        return teacher.detach(), stats

    @torch.no_grad()
    def update_teacher(self) -> None:
        """``theta_t <- a theta_t + (1 - a) theta_s`` (all parameters)."""
        a = self.ema_momentum
        for ema_param, param in zip(self.teacher.parameters(),
                                    self.model.parameters()):
            ema_param.copy_(a * ema_param + (1 - a) * param)

    @torch.no_grad()
    def stochastic_restore(self) -> None:
        """Each element of the restored parameters returns to its source
        value with probability ``restore_prob``."""
        if self.restore_prob <= 0:
            return
        for name, p in self.restore_params:
            mask = (torch.rand(p.shape) < self.restore_prob).to(p)
            p.copy_(self.source_params[name] * mask + p * (1. - mask))

    def adapt(self, ctx: BatchContext):
        prediction, stats = super().adapt(ctx)
        self.update_teacher()
        self.stochastic_restore()
        return prediction, stats

    def __repr__(self) -> str:
        return (super().__repr__()[:-1] +
                f', loss={self.loss_type!r}, '
                f'ema_momentum={self.ema_momentum}, '
                f'restore_prob={self.restore_prob}, ap={self.ap}, '
                f'num_augs={self.num_augs}, '
                f'always_augment={self.always_augment}, '
                f'augment={self.augment})')
