"""EcoTTA (Song et al., CVPR 2023): meta networks on a frozen network.

Patented by Qualcomm according to its authors (see docs/methods.md).
"""
import math

import torch

from ..losses import flatten_outputs, softmax_entropy
from ..registry import METHODS
from ..task_adapter import Batch
from .base import BaseMethod


@METHODS.register_module(name='ecotta')
class EcoTTA(BaseMethod):
    """EcoTTA: a regularisation step, then an entropy step, per batch.

    Follows the community completion in Lily-Le/EcoTTA (main.py adapt); the
    options and their defaults: docs/methods.md (EcoTTA). ``**kwargs``: see
    :class:`BaseMethod`.
    """

    supported_prediction_kinds = ('per_sample', )
    repr_fields = ('reg_weight', 'entropy_margin')
    default_optimizer = dict(type='SGD', lr=5e-3, momentum=0.9)
    default_trainable = dict(kind='all', name_regex=r'^ecotta\.')

    def __init__(self, reg_weight: float = 0.5, entropy_margin: float = 0.4,
                 **kwargs):
        super().__init__(**kwargs)
        self.reg_weight = float(reg_weight)
        self.entropy_margin = float(entropy_margin)
        self.meta = None

    def configure(self, model, task_adapter):
        meta = getattr(model, 'ecotta', None)
        if meta is None:
            raise ValueError(
                'EcoTTA adapts meta networks attached to the network: build '
                "it as network=dict(type='EcoTTANetwork', network=..., K=4) "
                '(configs/cls/_base_/models/*_ecotta-k*.py)')
        self.meta = meta
        super().configure(model, task_adapter)

    def set_modes(self, model):
        model.train()  # community main.py: net.train() before adapt()

    def regularisation_step(self, batch: Batch) -> torch.Tensor:
        """Take one step on ``reg_weight * sum_k R_k``; return that loss."""
        with self.meta.regularising():
            self.task_adapter.forward(self.model, batch)
            reg = self.reg_weight * self.meta.regulariser()
        self.backward_step(reg)
        return reg.detach()

    def base_loss(self, batch, fwd) -> torch.Tensor:
        """Return the mean entropy of the samples with ``H < E0`` (or 0)."""
        _, logits = flatten_outputs(fwd.head_outputs)
        entropy = softmax_entropy(logits)
        reliable = entropy < self.entropy_margin * math.log(logits.shape[1])
        fwd.stats.extra['num_reliable'] = float(reliable.sum())
        if not bool(reliable.any()):
            return entropy.sum() * 0.
        return entropy[reliable].mean(0)

    def forward_and_adapt(self, batch: Batch, beta=None):
        loss_reg = self.regularisation_step(batch)
        prediction, stats = super().forward_and_adapt(batch, beta)
        stats.extra['loss_reg'] = loss_reg
        return prediction, stats
