"""``STAGLoss``: the STAG alignment loss as a plain ``nn.Module``.

The segmentation adapter registers it into MMSeg's ``MODELS`` (so
``MODELS.build(dict(type='STAGLoss'))`` works in MMSeg configs); the core
builds it directly, without MMSeg.
"""
from typing import Optional, Tuple

import torch
import torch.nn as nn

from . import stag


class STAGLoss(nn.Module):
    """Structural Test-time Alignment of Gradients loss.

    ``loss(features, logits, cls_weight, cls_bias)`` returns
    ``loss_weight * L_STAG(B)`` (eq:stag_batch_loss): the mean over samples
    (``[N, D]``/``[N, C]`` inputs) or over valid pixels (``[N, D, H, W]``/
    ``[N, C, H, W]`` inputs) of the negative cosine between the analytic
    entropy gradient ``g = s h`` and the structural anchor of the predicted
    class. The same module serves classification and segmentation.

    Anchors (Phase 1) are cached and recomputed only when the classifier's
    weight or bias tensor changes (new tensor, new shape/dtype/device, or an
    in-place update such as an optimizer step), so a frozen classifier pays
    for them once and an adapted one once per step.

    ``logits`` must be the classifier's output on ``features`` (the paper's
    ``z = W h + b``). When the classifier weight is frozen
    (``requires_grad`` False, as for TENT and BN Adapt), the projections
    ``h . a_k`` are computed from the logits
    (:func:`~mmseg_stag.stag.projections_from_logits`): same values and
    same gradients, without the ``C x D`` projection of every sample/pixel
    and without a second ``D``-sized gradient on the features.

    Args:
        eps (float): the ``epsilon`` of eq:stag_loss. Default: 1e-8.
        anchor (str): ``'diagonal'`` (paper, eq:structural_anchor) or
            ``'full'`` (whole gradient of the self-structural entropy).
        label (str): ``'hard'`` (paper, argmax pseudo-label) or ``'soft'``
            (probability-weighted over all classes).
        loss_weight (float): multiplier of the loss. Default: 1.0.
        loss_name (str): name under which the loss is logged.
            Default: ``'loss_stag'``.
        ignore_index (int): label value treated as invalid when a label map
            is passed as ``valid_mask`` (an integer tensor). Default: 255.
    """

    def __init__(self,
                 eps: float = 1e-8,
                 anchor: str = 'diagonal',
                 label: str = 'hard',
                 loss_weight: float = 1.0,
                 loss_name: str = 'loss_stag',
                 ignore_index: int = 255):
        super().__init__()
        if anchor not in stag.ANCHOR_MODES:
            raise ValueError(
                f'STAGLoss: anchor must be one of {stag.ANCHOR_MODES}, '
                f'got {anchor!r}')
        if label not in stag.LABEL_MODES:
            raise ValueError(
                f'STAGLoss: label must be one of {stag.LABEL_MODES}, '
                f'got {label!r}')
        if not eps >= 0:
            raise ValueError(f'STAGLoss: eps must be >= 0, got {eps}')
        self.eps = float(eps)
        self.anchor = anchor
        self.label = label
        self.loss_weight = float(loss_weight)
        self.ignore_index = ignore_index
        self._loss_name = loss_name
        self._anchor_key: Optional[Tuple] = None
        self._anchors: Optional[torch.Tensor] = None
        self._coefficients: Optional[torch.Tensor] = None
        self.anchor_computations = 0

    @staticmethod
    def _tensor_key(tensor: Optional[torch.Tensor]) -> Tuple:
        if tensor is None:
            return (None, )
        # ``_version`` is bumped by every in-place update (optimizer steps).
        return (tensor.data_ptr(), tensor._version, tuple(tensor.shape),
                tensor.dtype, tensor.device)

    def anchors(self, cls_weight: torch.Tensor,
                cls_bias: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Structural anchors ``[C, D]`` for this classifier (cached)."""
        self._update_anchors(cls_weight, cls_bias)
        return self._anchors

    def anchor_coefficients(self, cls_weight: torch.Tensor,
                            cls_bias: Optional[torch.Tensor] = None
                            ) -> torch.Tensor:
        """``V`` with ``a_k = sum_j V_kj w_j`` (cached with the anchors)."""
        self._update_anchors(cls_weight, cls_bias)
        return self._coefficients

    def _update_anchors(self, cls_weight, cls_bias) -> None:
        key = self._tensor_key(cls_weight) + self._tensor_key(cls_bias)
        if self._anchors is None or key != self._anchor_key:
            with torch.no_grad():
                weight = cls_weight.detach()
                self._coefficients = stag.anchor_coefficients(
                    weight, None if cls_bias is None else cls_bias.detach(),
                    mode=self.anchor)
                self._anchors = stag.anchors_from_coefficients(
                    weight, self._coefficients)
            self._anchor_key = key
            self.anchor_computations += 1

    def _to_bool_mask(self, valid_mask: Optional[torch.Tensor]
                      ) -> Optional[torch.Tensor]:
        if valid_mask is None or valid_mask.dtype == torch.bool:
            return valid_mask
        if valid_mask.is_floating_point():
            raise ValueError(
                'STAGLoss: valid_mask must be a bool mask or an integer '
                f'label map (ignore_index={self.ignore_index}), got dtype '
                f'{valid_mask.dtype}')
        return valid_mask != self.ignore_index

    def forward(self,
                features: torch.Tensor,
                logits: torch.Tensor,
                cls_weight: torch.Tensor,
                cls_bias: Optional[torch.Tensor] = None,
                valid_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Compute ``loss_weight * L_STAG(B)``.

        Args:
            features (Tensor): classifier inputs, ``[N, D]`` or
                ``[N, D, H, W]``.
            logits (Tensor): classifier outputs from the same forward pass,
                ``[N, C]`` or ``[N, C, H, W]``.
            cls_weight (Tensor): classifier weight ``[C, D]`` or
                ``[C, D, 1, 1]``.
            cls_bias (Tensor, optional): classifier bias ``[C]``.
            valid_mask (Tensor, optional): bool mask (True = use) or an
                integer label map whose ``ignore_index`` entries are
                excluded; shape ``[N]`` or ``[N, H, W]``.

        Returns:
            Tensor: scalar loss.
        """
        weight = stag.check_classifier(cls_weight, cls_bias)
        mask = self._to_bool_mask(valid_mask)
        stag.check_inputs(features, logits, num_classes=weight.shape[0],
                          feature_dim=weight.shape[1], valid_mask=mask)
        # mixed precision: the term in float32 (autocast off, the C-sized
        # tensors upcast; the D-sized features stay as they are, their norm
        # is accumulated in float32, see stag.feature_norm)
        dtype = torch.float32 if features.dtype in (
            torch.float16, torch.bfloat16) else features.dtype
        with torch.autocast(device_type=features.device.type, enabled=False):
            logits = logits.to(dtype)
            anchors = self.anchors(cls_weight, cls_bias).to(dtype)
            if not cls_weight.requires_grad:
                # a trainable bias enters z and (z - b) alike: no gradient
                projections = stag.projections_from_logits(
                    logits, self._coefficients, cls_bias)
            else:
                projections = stag.project_on_anchors(
                    features, anchors.to(features.dtype)).to(dtype)
            per_sample = stag.stag_alignment(features, logits, anchors,
                                             eps=self.eps, label=self.label,
                                             projections=projections)
            loss = stag.check_finite_loss(
                stag.reduce_batch_loss(per_sample, mask), features=features,
                logits=logits)
        return self.loss_weight * loss

    @property
    def loss_name(self) -> str:
        """Name of the loss in logs (MMSeg's loss convention)."""
        return self._loss_name

    def extra_repr(self) -> str:
        return (f'eps={self.eps}, anchor={self.anchor!r}, '
                f'label={self.label!r}, loss_weight={self.loss_weight}')
