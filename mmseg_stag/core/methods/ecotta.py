"""EcoTTA (Song et al., CVPR 2023): continual adaptation of meta networks on
a frozen network, with self-distilled regularisation.

The method is patented by Qualcomm according to its authors, who released a
sample notebook only (``Lily-Le/EcoTTA`` at ``d72f0ce``,
``ecotta_sample_code.py``: the architecture, :mod:`.ecotta_networks`). The
test-time step follows the community completion in the same repository
(``main.py`` ``adapt`` at its last commit, which reproduces the paper's
CIFAR numbers); the notebook points to EATA's code for the optimizer and
the entropy loss.
"""
import math
from typing import Optional

import torch

from ..losses import per_sample_logits, softmax_entropy
from ..registry import METHODS
from .base import BaseMethod, BatchContext


@METHODS.register_module(name='ecotta')
class EcoTTA(BaseMethod):
    """EcoTTA on a network with meta networks (``network.ecotta``, see
    :func:`~.ecotta_networks.attach_meta_networks`; configs build it with
    ``EcoTTANetwork``).

    One ``adapt`` call, two optimizer steps (community ``main.py``)::

        forward with every part's input detached -> lambda * sum_k R_k
            -> backward -> step                        (R_k trains meta k)
        forward -> prediction; L_ent over samples with H < E0
            (+ beta_t L_STAG on the frozen classifier) -> backward -> step

    The whole network runs in ``train()`` mode (batch statistics in the
    frozen and the meta BNs); only the meta networks train. A batch without
    a reliable sample still steps (zero gradient, SGD momentum), as the
    authors' mean over an empty selection does; ``t`` counts batches.

    Args:
        reg_weight (float): ``lambda`` of the self-distilled regularisation.
            Default: 0.5 (the paper's value as quoted by the community
            code; its reproduction command uses 0.25).
        entropy_margin (float): ``E0 = entropy_margin * ln C`` (EATA's
            ``e_margin``). Default: 0.4.
        optimizer (dict): default SGD lr 5e-3, momentum 0.9 (EATA's CIFAR
            settings, batch 64).
        trainable (dict): default the meta networks
            (``name_regex='^ecotta\\.'``).
        **kwargs: see :class:`BaseMethod` (``stag``, ...).
    """

    supported_outputs = ('per_sample', )

    def __init__(self, reg_weight: float = 0.5, entropy_margin: float = 0.4,
                 optimizer: Optional[dict] = None,
                 trainable: Optional[dict] = None, **kwargs):
        super().__init__(
            optimizer=optimizer or dict(type='SGD', lr=5e-3, momentum=0.9),
            trainable=trainable or dict(kind='all', name_regex=r'^ecotta\.'),
            **kwargs)
        self.reg_weight = float(reg_weight)
        self.entropy_margin = float(entropy_margin)
        self.meta = None

    def configure(self, model, classifier, output='per_sample'):
        meta = getattr(model, 'ecotta', None)
        if meta is None:
            raise ValueError(
                'EcoTTA adapts meta networks attached to the network: build '
                "it as network=dict(type='EcoTTANetwork', network=..., K=4) "
                '(configs/cls/_base_/models/*_ecotta-k*.py)')
        self.meta = meta
        super().configure(model, classifier, output)

    def set_modes(self, model):
        model.train()  # community main.py: net.train() before adapt()

    def regularisation_step(self, ctx: BatchContext) -> float:
        """``lambda * sum_k R_k`` on a forward with detached part inputs,
        one step. Returns the loss."""
        with self.meta.regularising():
            ctx.forward(self.model, ctx.inputs)
            reg = self.reg_weight * self.meta.regulariser()
        self.optimizer.zero_grad(set_to_none=True)
        reg.backward()
        self.optimizer.step()
        return reg.item()

    def base_loss(self, ctx: BatchContext) -> torch.Tensor:
        """Mean entropy of the samples with ``H < E0`` (zero, with zero
        gradients, when there is none)."""
        _, logits = per_sample_logits(ctx.head_outputs, 'EcoTTA')
        entropy = softmax_entropy(logits)
        reliable = entropy < self.entropy_margin * math.log(logits.shape[1])
        ctx.stats['num_reliable'] = float(reliable.sum())
        if not bool(reliable.any()):
            return entropy.sum() * 0.
        return entropy[reliable].mean(0)

    def adapt(self, ctx: BatchContext):
        if self.model is None:
            raise RuntimeError('EcoTTA.configure(model, classifier) must be '
                               'called before adapt')
        ctx.stats['loss_reg'] = self.regularisation_step(ctx)
        return super().adapt(ctx)

    def __repr__(self) -> str:
        return (super().__repr__()[:-1] + f', reg_weight={self.reg_weight},'
                f' entropy_margin={self.entropy_margin})')
