"""Hybrid-TTA (Park et al., ICCV 2025): an EMA teacher labels each image;
the student learns from a masked view (SimMIM) and switches between full
and efficient tuning by its segmentation loss (docs/methods.md).

Follows hhhyyeee/Hybrid-TTA: mmseg/apis/test_feat.py (single_gpu_our) and
mmseg/ood/base.py (FreezeController, mode loss_seg_with_wma).
"""
import copy
import math
import re
from typing import List, Optional, Sequence

import numpy as np
import torch
from mmengine.logging import print_log

from mmseg_stag.checkpoint import attach_added_modules
from mmseg_stag.core import METHODS, Labels, NonFiniteStatistic, StepStats
from mmseg_stag.core.methods.base import BaseMethod
from mmseg_stag.core.methods.cotta import ema_update_
from mmseg_stag.core.registry import check_range
from ..models.hybrid_tta_modules import (PatchMaskGenerator, masked_l1,
                                         masked_mit_features)

#: what efficient tuning freezes (ood/base.py:24-26): the MiT blocks (the
#: authors' "block1" .. "block4") but their parallel adapters
BLOCK_PARAM = re.compile(r'^backbone\.layers\.\d+\.1\.')
#: a parallel adapter's parameters (``AdaptedMixFFN.adapter``, not the
#: method's ``self.task_adapter``)
PARALLEL_ADAPTER = '.adapter.'


class TuningSwitch:
    """Full or efficient tuning, from the student's segmentation loss.

    Efficient when the mean of the last ``window`` losses is below
    ``(1 + margin) * threshold``; the threshold is then an EMA of the loss
    (ood/base.py:242-266). Neither the window nor the threshold restart at
    a new stage; the tuning does (full). The arguments are the authors'
    ``wma_window_size``, ``wma_perc``, ``loss_seg_alpha`` (the threshold's
    momentum) and ``loss_seg_threshold`` (its start).
    """

    def __init__(self, window: int = 10, margin: float = 0.1,
                 momentum: float = 0.999, threshold: float = 0.0):
        if int(window) != window or window < 1:
            raise ValueError(f'switch window must be an integer >= 1, got '
                             f'{window}')
        self.window, self.margin = int(window), float(margin)
        self.momentum, self.threshold = float(momentum), float(threshold)
        self.losses: List[float] = []
        self.efficient = False

    def decide(self, loss: float) -> bool:
        """Add one loss; return whether to tune efficiently
        (:class:`NonFiniteStatistic`, the switch unchanged, if the loss is
        nan or inf: one would hold the threshold there for the rest of the
        run)."""
        if not math.isfinite(loss):
            raise NonFiniteStatistic('loss_seg', float(loss),
                                     method='HybridTTA')
        self.losses = (self.losses + [float(loss)])[-self.window:]
        self.efficient = bool(len(self.losses) == self.window and np.mean(
            self.losses) < (1 + self.margin) * self.threshold)
        self.threshold = (self.threshold * self.momentum +
                          float(loss) * (1 - self.momentum))
        return self.efficient

    def state_dict(self) -> dict:
        return dict(losses=list(self.losses), threshold=self.threshold,
                    efficient=self.efficient)

    def __repr__(self) -> str:
        return (f'TuningSwitch(window={self.window}, margin={self.margin}, '
                f'momentum={self.momentum})')

    def load_state_dict(self, state: dict) -> None:
        self.losses = list(state['losses'])
        self.threshold, self.efficient = state['threshold'], state['efficient']


@METHODS.register_module(name='hybrid_tta')
class HybridTTA(BaseMethod):
    """Hybrid-TTA on an MMSeg SegFormer (MiT backbone): one image, step by
    step, in docs/methods.md.

    Args:
        ema_momentum (float): Teacher EMA.
        recon_weight (float): The authors' ``recon_lambda``.
        mask_ratio, mask_patch_size, mask_seed: Of
            :class:`PatchMaskGenerator`.
        adapter_hidden, adapter_init, neck_embed_dim: Of
            :func:`attach_modules` (``adapter_init``: ``'backbone'``, the
            authors' effective init, or ``'zero_up'``).
        switch (dict, optional): :class:`TuningSwitch` arguments.
        optimizer (dict, optional): Default: Adam, lr 7.5e-5 (6e-4 / 8).
        trainable (dict, optional): Default: ``dict(kind='all')``.
        stage_restart (tuple): Default: ``('optimizer', )``, a fresh
            optimizer per stage (the authors' test_feat.py:124-136).
        **kwargs: See :class:`BaseMethod` (``stag``).
    """

    supported_prediction_kinds = ('per_pixel', )
    needs_original_size = True
    default_optimizer = dict(type='Adam', lr=7.5e-5, betas=(0.9, 0.999))
    default_trainable = dict(kind='all')
    state_attributes = ('teacher', 'switch')
    repr_fields = ('ema_momentum', 'recon_weight', 'mask_ratio', 'module_cfg',
                   'switch')

    def __init__(self,
                 ema_momentum: float = 0.999,
                 recon_weight: float = 0.3,
                 mask_ratio: float = 0.6,
                 mask_patch_size: int = 32,
                 mask_seed: int = 42,
                 adapter_hidden: int = 5,
                 adapter_init: str = 'backbone',
                 neck_embed_dim: int = 768,
                 switch: Optional[dict] = None,
                 stage_restart: Sequence[str] = ('optimizer', ),
                 **kwargs):
        check_range('in [0, 1]', ema_momentum=ema_momentum)
        super().__init__(stage_restart=stage_restart, **kwargs)
        self.ema_momentum = float(ema_momentum)
        self.recon_weight = float(recon_weight)
        self.masks = PatchMaskGenerator(mask_patch_size, 4, mask_ratio,
                                        mask_seed)
        self.module_cfg = dict(adapter_hidden=int(adapter_hidden),
                               adapter_init=adapter_init,
                               neck_embed_dim=int(neck_embed_dim))
        self.switch = TuningSwitch(**(switch or {}))
        self.teacher = None

    def prepare_model(self, model):
        mode = model.test_cfg.get('mode', 'whole')
        if mode != 'whole':
            raise ValueError(
                f"Hybrid-TTA masks the whole image: test_cfg.mode={mode!r} "
                "is not supported (use model.test_cfg.mode='whole', as the "
                "ACDC configs do)")
        counts = attach_added_modules(
            model, dict(type='hybrid_tta', **self.module_cfg),
            'the Hybrid-TTA config (test_cfg.method)')
        if counts is None:
            # attached already, with these options: a stage that restarts
            # from the source state (theirs included), or an adapted
            # checkpoint the strict loader attached them for
            print_log('Hybrid-TTA: the modules are attached already (a '
                      'restart from the source state, or an adapted '
                      'checkpoint, theirs included)', logger='current')
            return
        print_log(
            'Hybrid-TTA adds modules the source checkpoint does not have, '
            f'from their initialisation: {counts["num_adapters"]} parallel '
            f'adapters ({counts["adapters"]:,} parameters, adapter_init='
            f'{self.module_cfg["adapter_init"]!r}), the mask token '
            f'({counts["mask_token"]}), the reconstruction neck '
            f'({counts["recon_neck"]:,})', logger='current')

    def configure(self, model, task_adapter):
        super().configure(model, task_adapter)
        # the authors' create_ema_model: the teacher starts as the student
        self.teacher = copy.deepcopy(model).requires_grad_(False)

    def set_efficient(self, efficient: bool) -> None:
        """Freeze (efficient) or unfreeze the MiT blocks but their parallel
        adapters."""
        for name, p in self.model.named_parameters():
            if BLOCK_PARAM.match(name) and PARALLEL_ADAPTER not in name:
                p.requires_grad_(not efficient)

    def start_stage(self, index: int) -> None:
        # every stage starts fully trainable (test_feat.py:118)
        if index != self.stage_index:
            self.switch.efficient = False
            self.set_efficient(False)
        super().start_stage(index)

    def state_dict(self) -> dict:
        return dict(super().state_dict(), mask_rng=self.masks.rng_state())

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.masks.load_rng_state(state['mask_rng'])
        self.set_efficient(self.switch.efficient)

    def masked_forward(self, batch):
        """The student on the masked image, as MMSeg's ``encode_decode``
        runs a segmentor (in the head probe): ``(ForwardPass, the backbone's
        levels, token mask)``."""
        mask = self.masks(tuple(batch.inputs.shape[-2:])).to(
            batch.inputs.device)
        levels = []

        def encode_decode(inputs):
            model = self.model
            levels.extend(masked_mit_features(model.backbone, inputs, mask))
            feats = model.neck(levels) if model.with_neck else levels
            return model.decode_head.predict(feats, batch.metas,
                                             model.test_cfg)

        fwd = self.task_adapter.forward(self.model, batch, run=encode_decode)
        return fwd, levels, mask

    def forward_and_adapt(self, batch, beta=None):
        """Label with the teacher, train the student on its masked view,
        update the teacher; return the teacher's labels."""
        with torch.no_grad():
            labels = self.task_adapter.labels_at_original_size(
                batch, self.task_adapter.forward(self.teacher, batch))
        student, levels, mask = self.masked_forward(batch)
        loss_seg = self.task_adapter.cross_entropy_at_original_size(
            student, labels)
        loss_recon = masked_l1(self.model.recon_neck(levels), batch.inputs,
                               mask)
        # the switch reads the cross-entropy alone (STAG-free, as theirs),
        # after the forward and before the backward (test_feat.py:334-355)
        self.set_efficient(self.switch.decide(loss_seg.item()))
        student.stats.extra.update(loss_seg=loss_seg.detach(),
                                   loss_recon=loss_recon.detach(),
                                   efficient=float(self.switch.efficient))
        self.backward_step(self.add_stag(
            loss_seg + self.recon_weight * loss_recon, student, beta))
        ema_update_(self.teacher, self.model, self.ema_momentum)
        return Labels(labels), StepStats([student.stats])

    @property
    def mask_ratio(self) -> float:
        return self.masks.mask_ratio
