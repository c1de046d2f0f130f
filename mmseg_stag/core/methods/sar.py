"""SAR (Niu et al., ICLR 2023): sharpness-aware and reliable entropy
minimisation.

Follows the authors' code (github.com/mr-eggplant/SAR, ``sar.py``
``forward_and_adapt_sar``, ``sam.py`` and ``collect_params``); on
segmentation outputs every pixel is a sample (see :class:`SAR`).
"""
import copy
import math
from typing import Optional

import torch

from ..losses import flatten_outputs, softmax_entropy
from ..registry import METHODS
from ..sam import SAM
from .base import BaseMethod, BatchContext

#: Module names the authors' ``collect_params`` never adapts: the last stage
#: (``layer4`` of ResNets, ``blocks.9``-``blocks.11`` of ViT-B) and the final
#: ``norm`` (substring tests on module names, as in their code).
SAR_AUTHORS_EXCLUDE = r'layer4|blocks\.9|blocks\.10|blocks\.11|norm\.|^norm$'


@METHODS.register_module(name='sar')
class SAR(BaseMethod):
    """SAR: reliable entropy minimisation with a SAM update and recovery.

    One ``adapt`` (authors' ``forward_and_adapt_sar``): forward 1 (the
    prediction), ``L1 = mean_{H < E0} H (+ beta_t L_STAG)``, backward,
    :meth:`SAM.first_step`; forward 2 at ``theta + e_w``,
    ``L2 = mean H2`` over the samples kept by both passes (``+ beta_t
    L_STAG``), ``ema = 0.9 ema + 0.1 L2_base``, backward,
    :meth:`SAM.second_step`; recovery (:meth:`recover`) when
    ``ema < reset_constant``: the parameters return to their values at
    ``configure``, the EMA and the base optimizer's momentum are kept (the
    authors' ``SAR.forward``/``reset``). ``beta_t`` is the same in both
    passes. Empty filters: see ``momentum_step_on_empty`` and the README.

    Segmentation (``'per_pixel'`` outputs; no code of the authors exists),
    as the per-pixel SAR of HiLab-git/SicTTA (``sotas/sar.py``, Medical
    Image Analysis): every pixel of the head's output ``[N, C, h, w]`` is a
    sample (:func:`~mmseg_stag.core.losses.flatten_outputs`, all crops'
    pixels concatenated). Filter 1 keeps the pixels with ``H < E0`` of
    forward 1, ``L1`` is their mean entropy; after the SAM first step the
    whole image is forwarded again, filter 2 keeps, among the pixels of
    filter 1 (the authors' ``entropys2 = entropys2[filter_ids_1]`` with
    pixels), those with ``H2 < E0``; ``L2`` is their mean entropy, and its
    EMA and the recovery are unchanged. SicTTA lowers the recovery
    threshold to 0.025 for its 4-class task; the default here stays the
    authors' 0.2 (``reset_constant``). ``num_kept1``/``num_kept2`` count
    pixels.

    Args:
        entropy_margin (float): ``E0`` as a fraction of ``ln C``.
            Default: 0.4.
        rho (float): SAM neighbourhood size (non-adaptive SAM).
            Default: 0.05.
        reset_constant (float): recovery threshold ``e_m`` on the EMA of
            the loss. Default: 0.2 (the authors compare with the literal
            0.2; their ``reset_constant_em`` argument is unused).
        exclude_regex (str, optional): trainable parameters whose *module*
            name matches (``re.search``) are left frozen. Default: the
            authors' exclusion :data:`SAR_AUTHORS_EXCLUDE`; ``None``: keep
            every parameter chosen by ``trainable``.
        momentum_step_on_empty (bool): with both filters empty (STAG off),
            step the base optimizer with zero gradients, i.e. by its
            momentum alone, as the authors' NaN-loss path does. Default:
            True; False: no update at all.
        reset_optimizer (bool): the recovery also restores the base
            optimizer's state (momentum buffers) to its value at
            ``configure``. Default: False, as the authors: their reset calls
            ``SAM.load_state_dict``, which restores SAM's own state (only
            ``old_p``) and the groups' hyper-parameters (never changed
            here), not the momentum buffers held in
            ``base_optimizer.state``.
        reset_clears_ema (bool): after a recovery the EMA starts afresh
            (``None``). Default: False, as the authors: ``SAR.forward``
            calls ``self.reset()`` (which sets ``self.ema = None``) and then
            ``self.ema = ema``, so the EMA of the recovering batch is kept
            and recovery fires again on the next batches while it stays
            below ``reset_constant``.
        optimizer (dict): the base optimizer of SAM (MMEngine
            ``OPTIMIZERS``). Default: SGD lr 0.00025, momentum 0.9.
        **kwargs: see :class:`BaseMethod` (``stag``, ``trainable``, ...).
    """

    supported_outputs = ('per_sample', 'per_pixel')

    def __init__(self,
                 entropy_margin: float = 0.4,
                 rho: float = 0.05,
                 reset_constant: float = 0.2,
                 exclude_regex: Optional[str] = SAR_AUTHORS_EXCLUDE,
                 momentum_step_on_empty: bool = True,
                 reset_optimizer: bool = False,
                 reset_clears_ema: bool = False,
                 optimizer: Optional[dict] = None,
                 **kwargs):
        if not entropy_margin > 0:
            raise ValueError(
                f'entropy_margin must be > 0, got {entropy_margin}')
        if not rho >= 0:
            raise ValueError(f'rho must be >= 0, got {rho}')
        super().__init__(
            optimizer=optimizer or dict(type='SGD', lr=0.00025,
                                        momentum=0.9),
            **kwargs)
        self.entropy_margin = float(entropy_margin)
        self.rho = float(rho)
        self.reset_constant = float(reset_constant)
        self.exclude_regex = exclude_regex
        self.momentum_step_on_empty = bool(momentum_step_on_empty)
        self.reset_optimizer = bool(reset_optimizer)
        self.reset_clears_ema = bool(reset_clears_ema)
        self.e_margin: Optional[float] = None
        self.output: Optional[str] = None  # set by configure
        self.ema: Optional[float] = None
        self.num_resets = 0
        self._initial_params = {}
        self._initial_optimizer = None

    def build_optimizer(self):
        return SAM(super().build_optimizer(), rho=self.rho)

    def configure(self, model, classifier, output='per_sample'):
        super().configure(model, classifier, output)
        self.output = output
        self.exclude_modules(self.exclude_regex)
        self.e_margin = self.entropy_margin * math.log(
            int(classifier.weight.shape[0]))
        self.ema = None
        self._initial_params = {n: p.detach().clone()
                                for n, p in self.params}
        self._initial_optimizer = copy.deepcopy(
            self.optimizer.base_optimizer.state_dict())

    def state_dict(self) -> dict:
        # the recovery targets (_initial_*) come from configure
        return dict(super().state_dict(), ema=self.ema,
                    num_resets=self.num_resets)

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.ema, self.num_resets = state['ema'], state['num_resets']

    # ------------------------------------------------------------------
    def base_loss(self, ctx: BatchContext) -> Optional[torch.Tensor]:
        """Mean entropy of the samples (pixels) with ``H < E0`` (and in
        ``ctx.among`` when set); ``None`` when none is kept. Sets
        ``ctx.kept`` (a mask over the samples, or over the pixels in
        :func:`~mmseg_stag.core.losses.flatten_outputs` order)."""
        _, logits = flatten_outputs(ctx.head_outputs, 'SAR',
                                    self.output or self.supported_outputs)
        entropies = softmax_entropy(logits)
        keep = entropies < self.e_margin
        if ctx.among is not None:
            keep = keep & ctx.among
        ctx.kept = keep
        ctx.stats['num_kept'] = float(keep.sum())
        if not bool(keep.any()):
            return None
        return entropies[keep].mean(0)

    def reset(self) -> None:
        """The authors' ``SAR.reset``: trainable parameters back to their
        values at ``configure``, ``ema = None``; the base optimizer's
        momentum is kept unless ``reset_optimizer``."""
        with torch.no_grad():
            for name, p in self.params:
                p.copy_(self._initial_params[name])
        if self.reset_optimizer:
            # deviation (reset_optimizer): also clear the momentum buffers
            self.optimizer.load_base_state_dict(
                copy.deepcopy(self._initial_optimizer))
        self.ema = None
        self.num_resets += 1

    def recover(self) -> bool:
        """Model recovery after each batch (the authors' ``SAR.forward``):
        :meth:`reset` when ``ema < reset_constant``, then the EMA is put
        back unless ``reset_clears_ema``.

        Returns:
            bool: whether the recovery fired.
        """
        ema = self.ema
        if ema is None or not ema < self.reset_constant:
            return False
        self.reset()
        if self.reset_clears_ema:
            return True  # deviation (reset_clears_ema): the EMA stays None
        self.ema = ema  # sar.py SAR.forward: `self.ema = ema` after reset
        return True

    def adapt(self, ctx: BatchContext):
        if self.model is None:
            raise RuntimeError('SAR.configure(model, classifier) must be '
                               'called before adapt')
        sam = self.optimizer
        loss2, stats2 = None, {}
        try:
            # forward 1 (the prediction), filter 1, L1, backward
            loss1 = self.loss(self.forward_pass(ctx))
            stats1 = {k + '1': v for k, v in ctx.stats.items()}
            sam.zero_grad(set_to_none=True)
            if loss1 is not None:
                loss1.backward()
                sam.first_step()  # theta + e_w
                sam.zero_grad(set_to_none=True)
                # forward 2 at theta + e_w, filter 2 among filter 1
                second = self.forward_pass(
                    BatchContext(ctx.inputs, ctx.forward, among=ctx.kept))
                loss2 = self.loss(second)
                if 'loss_base' in second.stats:
                    base = second.stats['loss_base']
                    self.ema = base if self.ema is None else \
                        0.9 * self.ema + (1 - 0.9) * base
                stats2 = {k + '2': v for k, v in second.stats.items()}
                if loss2 is not None:
                    loss2.backward()
                    sam.second_step()  # back to theta, base optimizer step
        finally:
            sam.unperturb()  # back to theta whatever happened
        ctx.stats = {**stats1, **stats2}
        updated = loss2 is not None
        if updated:
            self.step += 1
            self.num_updates += 1
        elif self.momentum_step_on_empty:
            # the authors' zero-gradient step (see the class docstring)
            for _, p in self.params:
                p.grad = torch.zeros_like(p)
            sam.base_optimizer.step()
        sam.zero_grad(set_to_none=True)
        ctx.stats['updated'] = float(updated)
        ctx.stats['momentum_only_step'] = float(
            not updated and self.momentum_step_on_empty)
        ctx.stats['reset'] = float(self.recover())
        if self.ema is not None:
            ctx.stats['ema'] = self.ema
        return ctx.prediction.detach(), ctx.stats

    def __repr__(self) -> str:
        return (super().__repr__()[:-1] +
                f', entropy_margin={self.entropy_margin}, rho={self.rho}, '
                f'reset_constant={self.reset_constant}, '
                f'reset_optimizer={self.reset_optimizer}, '
                f'reset_clears_ema={self.reset_clears_ema}, '
                f'exclude_regex={self.exclude_regex!r})')
