"""STAG math in plain PyTorch; labels ``eq:...`` are in docs/equations.md."""
import math
from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

ANCHOR_MODES = ('diagonal', 'full')
LABEL_MODES = ('hard', 'soft')


def flatten_classifier_weight(weight: torch.Tensor) -> torch.Tensor:
    """Classifier weight ``[C, D, 1, 1]`` or ``[C, D]`` as ``[C, D]``;
    ``ValueError`` for any other shape."""
    if weight.dim() == 4 and weight.shape[2:] == (1, 1):
        return weight.flatten(1)
    if weight.dim() != 2:
        raise ValueError(
            'classifier weight must be [C, D] or a 1x1 conv weight '
            f'[C, D, 1, 1], got shape {tuple(weight.shape)}')
    return weight


def check_classifier(weight: torch.Tensor,
                     bias: Optional[torch.Tensor] = None,
                     check_finite: bool = True) -> torch.Tensor:
    """Return ``W [C, D]``; raise ``ValueError`` on a bad ``W`` or ``b``.

    ``check_finite=False`` checks the shapes only (no wait for the device).
    """
    weight = flatten_classifier_weight(weight)
    if bias is not None and tuple(bias.shape) != (weight.shape[0], ):
        raise ValueError(
            f'classifier bias must have shape [C] = [{weight.shape[0]}], '
            f'got {tuple(bias.shape)} (weight {tuple(weight.shape)})')
    for name, tensor in (('weight', weight), ('bias', bias)):
        if check_finite and tensor is not None and \
                not bool(torch.isfinite(tensor).all()):
            raise ValueError(f'classifier {name} contains non-finite values '
                             '(nan or inf)')
    return weight


def check_inputs(features: torch.Tensor,
                 logits: torch.Tensor,
                 num_classes: Optional[int] = None,
                 feature_dim: Optional[int] = None,
                 valid_mask: Optional[torch.Tensor] = None) -> None:
    """Raise ``ValueError`` naming the shapes if the inputs do not fit."""
    if features.dim() not in (2, 4) or logits.dim() != features.dim():
        raise ValueError(
            'features and logits must be [N, D] and [N, C] (per sample) or '
            '[N, D, H, W] and [N, C, H, W] (per pixel); got features '
            f'{tuple(features.shape)} and logits {tuple(logits.shape)}')
    if features.shape[0] != logits.shape[0] or \
            features.shape[2:] != logits.shape[2:]:
        raise ValueError(
            'features and logits must share batch and spatial sizes; got '
            f'features {tuple(features.shape)} and logits '
            f'{tuple(logits.shape)}')
    for what, sym, name, tensor, want in (
            ('feature dim', 'D', 'features', features, feature_dim),
            ('number of classes', 'C', 'logits', logits, num_classes)):
        if want is not None and tensor.shape[1] != want:
            raise ValueError(
                f'{what} {sym}={tensor.shape[1]} ({name} '
                f'{tuple(tensor.shape)}) does not match the classifier '
                f'weight {sym}={want}')
    if valid_mask is not None:
        expected = (logits.shape[0], ) + tuple(logits.shape[2:])
        if tuple(valid_mask.shape) != expected:
            raise ValueError(
                f'valid_mask must have shape {expected} (logits '
                f'{tuple(logits.shape)} without the class axis), got '
                f'{tuple(valid_mask.shape)}')


def check_finite_loss(loss: torch.Tensor, **inputs: torch.Tensor
                      ) -> torch.Tensor:
    """Return ``loss``; if not finite, raise ``ValueError`` naming an input."""
    if not bool(torch.isfinite(loss)):
        bad = [name for name, t in inputs.items()
               if t is not None and not bool(torch.isfinite(t).all())]
        raise ValueError(
            f'STAG loss is not finite: {", ".join(bad) or "an input"} '
            'contains non-finite values (nan or inf)')
    return loss


def inter_class_logits(weight: torch.Tensor,
                       bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Inter-class logits ``Z [C, C]`` (eq:inter-class_matrix)."""
    weight = flatten_classifier_weight(weight)
    z = weight @ weight.t()
    return z if bias is None else z + bias.unsqueeze(0)


def entropy_logit_gradient(logits: torch.Tensor, dim: int = 1) -> torch.Tensor:
    """Entropy gradient w.r.t. every logit (eq:appendix_dH_dz)."""
    log_p = F.log_softmax(logits, dim=dim)
    p = log_p.exp()
    entropy = -(p * log_p).sum(dim=dim, keepdim=True)
    return -p * (log_p + entropy)


def anchor_coefficients(weight: torch.Tensor,
                        bias: Optional[torch.Tensor] = None,
                        mode: str = 'diagonal',
                        check_finite: bool = True) -> torch.Tensor:
    """Anchor coefficients (eq:appendix_sk; eq:appendix_dHk_dZ if full):
    ``s [C]`` (``diagonal``) or ``V [C, C]`` (``full``); ``check_finite``
    as in :func:`check_classifier`; ``ValueError`` on an invalid ``mode``.
    """
    if mode not in ANCHOR_MODES:
        raise ValueError(f'anchor must be one of {ANCHOR_MODES}, got {mode!r}')
    weight = check_classifier(weight, bias, check_finite)
    grad_z = entropy_logit_gradient(inter_class_logits(weight, bias), dim=1)
    return grad_z.diagonal().clone() if mode == 'diagonal' else grad_z


def anchors_from_coefficients(weight: torch.Tensor,
                              coefficients: torch.Tensor) -> torch.Tensor:
    """Anchors ``a_k = sum_j V_kj w_j`` as ``[C, D]``."""
    weight = flatten_classifier_weight(weight)
    if coefficients.dim() == 1:
        return coefficients.unsqueeze(1) * weight
    return coefficients @ weight


def structural_anchors(weight: torch.Tensor,
                       bias: Optional[torch.Tensor] = None,
                       mode: str = 'diagonal') -> torch.Tensor:
    """Anchors ``[C, D]``, one per class, not detached
    (eq:structural_anchor, eq:appendix_anchor)."""
    return anchors_from_coefficients(
        weight, anchor_coefficients(weight, bias, mode))


def sample_sensitivity(
        logits: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """Logit-level sensitivity and pseudo-label ``(s, y)``, each ``[N]`` or
    ``[N, H, W]`` (eq:sample_sensitivity)."""
    pred = logits.argmax(dim=1, keepdim=True)
    sens = entropy_logit_gradient(logits, dim=1).gather(1, pred)
    return sens.squeeze(1), pred.squeeze(1)


def online_gradient(features: torch.Tensor,
                    logits: torch.Tensor) -> torch.Tensor:
    """Online gradient ``g = s h`` (eq:online_gradient, eq:appendix_gt)."""
    sens, _ = sample_sensitivity(logits)
    return sens.unsqueeze(1) * features


def project_on_anchors(features: torch.Tensor,
                        anchors: torch.Tensor) -> torch.Tensor:
    """Projections ``h . a_k`` from the features: ``[N, C(, H, W)]``."""
    if features.dim() == 2:
        return features @ anchors.t()
    return torch.einsum('ndhw,cd->nchw', features, anchors)


def projections_from_logits(logits: torch.Tensor,
                            coefficients: torch.Tensor,
                            bias: Optional[torch.Tensor] = None
                            ) -> torch.Tensor:
    """Projections ``h . a_k = sum_j V_kj (z_j - b_j)`` from the logits
    ``z = W h + b`` of a frozen classifier, shaped like ``logits``; ``V``
    of :func:`anchor_coefficients`."""
    shape = (1, -1) + (1, ) * (logits.dim() - 2)
    centred = logits if bias is None else logits - bias.view(shape).to(
        logits.dtype)
    coefficients = coefficients.to(logits.dtype)
    if coefficients.dim() == 1:
        return centred * coefficients.view(shape)
    if logits.dim() == 2:
        return centred @ coefficients.t()
    return torch.einsum('nj...,kj->nk...', centred, coefficients)


class _FeatureNorm(torch.autograd.Function):
    """``||h||`` over dim 1 with PyTorch's gradient in one ``D``-sized pass."""

    @staticmethod
    def forward(ctx, features):
        # keep the small norm in float32 rather than copy D-sized features
        norm = torch.linalg.vector_norm(features, dim=1, keepdim=True)
        if norm.dtype in (torch.float16, torch.bfloat16):
            norm = norm.float()
        ctx.save_for_backward(features, norm)
        return norm

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        features, norm = ctx.saved_tensors
        scale = torch.where(norm > 0, grad / norm, torch.zeros_like(grad))
        return features * scale.to(features.dtype)


def feature_norm(features: torch.Tensor) -> torch.Tensor:
    """``||h||`` per sample or pixel: ``[N, 1]`` or ``[N, 1, H, W]``."""
    return _FeatureNorm.apply(features)


def stag_alignment(features: torch.Tensor,
                   logits: torch.Tensor,
                   anchors: torch.Tensor,
                   eps: float = 1e-8,
                   label: str = 'hard',
                   projections: Optional[torch.Tensor] = None
                   ) -> torch.Tensor:
    """Per-sample (per-pixel) alignment loss ``L_STAG(x)`` (eq:stag_loss).

    ``features`` ``h [N, D(, H, W)]``, ``logits`` ``z [N, C(, H, W)]``,
    ``anchors`` ``[C, D]`` (constants of the loss); ``label``: ``'hard'``
    (paper) or ``'soft'`` (ablation); ``projections``: ``h . a_k`` if
    already known. Returns ``[N]`` or ``[N, H, W]``; ``ValueError`` on an
    unknown ``label``.
    """
    if label not in LABEL_MODES:
        raise ValueError(f'label must be one of {LABEL_MODES}, got {label!r}')
    if features.dim() == 2 and not features.is_contiguous():
        # a strided view (ViT class token) would keep the token map alive
        features = features.contiguous()
    h_norm = feature_norm(features)
    anchor_norm = torch.linalg.vector_norm(anchors, dim=1)
    anchor_norm = anchor_norm.view((1, -1) + (1, ) * (features.dim() - 2))
    proj = project_on_anchors(features, anchors) if projections is None \
        else projections
    sens_all = entropy_logit_gradient(logits, dim=1)
    if label == 'hard':
        pred = logits.argmax(dim=1, keepdim=True)
        sens = sens_all.gather(1, pred)
        numer = sens * proj.gather(1, pred)
        denom = sens.abs() * h_norm * anchor_norm.expand_as(
            proj).gather(1, pred) + eps
        return -(numer / denom).squeeze(1)
    cosine = sens_all * proj / (sens_all.abs() * h_norm * anchor_norm +
                                eps)
    probs = F.softmax(logits, dim=1)
    return -(probs * cosine).sum(dim=1)


def batch_alignment(features: torch.Tensor,
                    logits: torch.Tensor,
                    anchors: torch.Tensor,
                    eps: float = 1e-8,
                    label: str = 'hard',
                    coefficients: Optional[torch.Tensor] = None,
                    bias: Optional[torch.Tensor] = None,
                    valid_mask: Optional[torch.Tensor] = None
                    ) -> torch.Tensor:
    """``L_STAG(B)`` through autograd (eq:stag_batch_loss): the mean of
    :func:`stag_alignment` over samples (valid pixels).

    ``anchors`` in the logits' dtype. ``coefficients``: ``V`` of a frozen
    classifier, whose projections come from the logits
    (:func:`projections_from_logits`, with ``bias``); None: from the
    features.
    """
    if coefficients is not None:
        projections = projections_from_logits(logits, coefficients, bias)
    else:
        projections = project_on_anchors(
            features, anchors.to(features.dtype)).to(logits.dtype)
    return reduce_batch_loss(stag_alignment(
        features, logits, anchors, eps=eps, label=label,
        projections=projections), valid_mask)


def reduce_batch_loss(per_sample: torch.Tensor,
                      valid_mask: Optional[torch.Tensor] = None
                      ) -> torch.Tensor:
    """Mean over samples or valid pixels (eq:stag_batch_loss); 0 if none."""
    if valid_mask is None:
        return per_sample.mean()
    valid = valid_mask.to(dtype=torch.bool)
    count = valid.sum()
    total = torch.where(valid, per_sample, per_sample.new_zeros(())).sum()
    return total / count.clamp(min=1).to(per_sample.dtype)


def stag_loss(features: torch.Tensor,
              logits: torch.Tensor,
              weight: torch.Tensor,
              bias: Optional[torch.Tensor] = None,
              eps: float = 1e-8,
              anchor: str = 'diagonal',
              label: str = 'hard',
              valid_mask: Optional[torch.Tensor] = None,
              anchors: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Batch loss ``L_STAG(B)`` from forward quantities (eq:stag_batch_loss).

    Args:
        features (Tensor): Classifier inputs ``[N, D(, H, W)]``.
        logits (Tensor): Classifier outputs ``[N, C(, H, W)]``.
        weight (Tensor): ``[C, D]`` or ``[C, D, 1, 1]``.
        bias (Tensor, optional): ``[C]``.
        eps (float): The ``epsilon`` of eq:stag_loss. Default: 1e-8.
        anchor (str): ``'diagonal'`` (paper) or ``'full'``.
        label (str): ``'hard'`` (paper) or ``'soft'``.
        valid_mask (Tensor, optional): Bool mask ``[N(, H, W)]``.
        anchors (Tensor, optional): Precomputed ``[C, D]`` anchors.

    Returns:
        Tensor: Scalar, differentiable w.r.t. ``features`` and ``logits``.

    Raises:
        ValueError: On shapes that do not fit or a non-finite loss.
    """
    weight = check_classifier(weight, bias)
    check_inputs(features, logits, num_classes=weight.shape[0],
                 feature_dim=weight.shape[1], valid_mask=valid_mask)
    if anchors is None:
        with torch.no_grad():
            anchors = structural_anchors(weight, bias, mode=anchor)
    anchors = anchors.detach().to(dtype=features.dtype)
    return check_finite_loss(
        batch_alignment(features, logits, anchors, eps=eps, label=label,
                        valid_mask=valid_mask),
        features=features, logits=logits)


def stag_beta(beta0: float, gamma: float, step: int) -> float:
    """``beta_t = beta0 exp(-t / gamma)``, ``t`` from 0 (eq:adaptive_decay).

    Raises:
        ValueError: If ``gamma <= 0`` or ``step < 0``.
    """
    if gamma <= 0:
        raise ValueError(f'gamma must be > 0, got {gamma}')
    if step < 0:
        raise ValueError(f'step must be >= 0, got {step}')
    return float(beta0) * math.exp(-step / float(gamma))
