"""STAG math in pure PyTorch: structural anchors, sensitivities, alignment loss.

Every function names the equation it implements by the paper's LaTeX label
(e.g. ``eq:stag_loss``; the README says where the paper's source is).
Nothing here imports MMSeg/MMEngine so the module can be read and tested on
its own.

Shapes. The class axis is always ``dim=1``:

* per sample: ``features [N, D]``, ``logits [N, C]``;
* per pixel:  ``features [N, D, H, W]``, ``logits [N, C, H, W]``, optional
  ``valid_mask [N, H, W]`` (bool) at the same resolution (the relation
  ``g = s * h`` holds only at the classifier's own resolution).

The classifier is ``z = W h + b`` with ``W [C, D]`` (or a 1x1 conv weight
``[C, D, 1, 1]``) and ``b [C]`` or ``None``.
"""
import math
from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

ANCHOR_MODES = ('diagonal', 'full')
LABEL_MODES = ('hard', 'soft')


# --------------------------------------------------------------------------
# Input checks
# --------------------------------------------------------------------------
def flatten_classifier_weight(weight: torch.Tensor) -> torch.Tensor:
    """Return a classifier weight as ``[C, D]`` (accepts ``[C, D, 1, 1]``)."""
    if weight.dim() == 4 and weight.shape[2:] == (1, 1):
        return weight.flatten(1)
    if weight.dim() != 2:
        raise ValueError(
            'classifier weight must be [C, D] or a 1x1 conv weight '
            f'[C, D, 1, 1], got shape {tuple(weight.shape)}')
    return weight


def _check_finite(name: str, tensor: torch.Tensor) -> None:
    if not bool(torch.isfinite(tensor).all()):
        raise ValueError(f'{name} contains non-finite values (nan or inf)')


def check_classifier(weight: torch.Tensor,
                     bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Validate ``W``/``b`` and return ``W`` as ``[C, D]``."""
    weight = flatten_classifier_weight(weight)
    if bias is not None and tuple(bias.shape) != (weight.shape[0], ):
        raise ValueError(
            f'classifier bias must have shape [C] = [{weight.shape[0]}], '
            f'got {tuple(bias.shape)} (weight {tuple(weight.shape)})')
    _check_finite('classifier weight', weight)
    if bias is not None:
        _check_finite('classifier bias', bias)
    return weight


def check_inputs(features: torch.Tensor,
                 logits: torch.Tensor,
                 num_classes: Optional[int] = None,
                 feature_dim: Optional[int] = None,
                 valid_mask: Optional[torch.Tensor] = None) -> None:
    """Raise ``ValueError`` naming the problem if the shapes do not fit
    (finiteness is checked on the loss, see :func:`check_finite_loss`).

    Args:
        features: ``[N, D]`` or ``[N, D, H, W]``.
        logits: ``[N, C]`` or ``[N, C, H, W]``.
        num_classes: expected ``C`` (from the classifier weight).
        feature_dim: expected ``D`` (from the classifier weight).
        valid_mask: optional ``[N, H, W]`` (per pixel) or ``[N]`` mask.
    """
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
    if feature_dim is not None and features.shape[1] != feature_dim:
        raise ValueError(
            f'feature dim D={features.shape[1]} (features '
            f'{tuple(features.shape)}) does not match the classifier '
            f'weight D={feature_dim}')
    if num_classes is not None and logits.shape[1] != num_classes:
        raise ValueError(
            f'number of classes C={logits.shape[1]} (logits '
            f'{tuple(logits.shape)}) does not match the classifier '
            f'weight C={num_classes}')
    if valid_mask is not None:
        expected = (logits.shape[0], ) + tuple(logits.shape[2:])
        if tuple(valid_mask.shape) != expected:
            raise ValueError(
                f'valid_mask must have shape {expected} (logits '
                f'{tuple(logits.shape)} without the class axis), got '
                f'{tuple(valid_mask.shape)}')


def check_finite_loss(loss: torch.Tensor, **inputs: torch.Tensor
                      ) -> torch.Tensor:
    """Raise ``ValueError`` naming the non-finite input if ``loss`` is not
    finite. Inputs are scanned only on that error path, so a normal step
    pays for one scalar check instead of full passes over the features."""
    if not bool(torch.isfinite(loss)):
        bad = [name for name, t in inputs.items()
               if t is not None and not bool(torch.isfinite(t).all())]
        raise ValueError(
            f'STAG loss is not finite: {", ".join(bad) or "an input"} '
            'contains non-finite values (nan or inf)')
    return loss


# --------------------------------------------------------------------------
# Phase 1: structural anchors
# --------------------------------------------------------------------------
def inter_class_logits(weight: torch.Tensor,
                       bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Inter-class similarity matrix, eq:inter-class_matrix.

    ``Z_kj = w_j . w_k + b_j``: row ``k`` holds the logits of the virtual
    input ``w_k``.
    """
    weight = flatten_classifier_weight(weight)
    z = weight @ weight.t()
    return z if bias is None else z + bias.unsqueeze(0)


def entropy_logit_gradient(logits: torch.Tensor, dim: int = 1) -> torch.Tensor:
    """``dH/dz_j = -p_j (ln p_j + H(p))`` for every class, eq:appendix_dH_dz.

    Computed from ``log_softmax`` so that saturated probabilities give 0,
    not ``0 * -inf``.
    """
    log_p = F.log_softmax(logits, dim=dim)
    p = log_p.exp()
    entropy = -(p * log_p).sum(dim=dim, keepdim=True)
    return -p * (log_p + entropy)


def anchor_coefficients(weight: torch.Tensor,
                        bias: Optional[torch.Tensor] = None,
                        mode: str = 'diagonal') -> torch.Tensor:
    """The anchors in the basis of the classifier rows: ``a_k = sum_j V_kj
    w_j``. ``diagonal``: ``V = diag(s_k)``, returned as the vector ``s``
    ``[C]`` (eq:appendix_sk); ``full``: ``V = dH_k/dZ_kj``, ``[C, C]``
    (eq:appendix_dHk_dZ). See :func:`structural_anchors`."""
    if mode not in ANCHOR_MODES:
        raise ValueError(f'anchor must be one of {ANCHOR_MODES}, got {mode!r}')
    weight = check_classifier(weight, bias)
    grad_z = entropy_logit_gradient(inter_class_logits(weight, bias), dim=1)
    return grad_z.diagonal().clone() if mode == 'diagonal' else grad_z


def anchors_from_coefficients(weight: torch.Tensor,
                              coefficients: torch.Tensor) -> torch.Tensor:
    """``a_k = sum_j V_kj w_j``: ``[C, D]``."""
    weight = flatten_classifier_weight(weight)
    if coefficients.dim() == 1:
        return coefficients.unsqueeze(1) * weight
    return coefficients @ weight


def structural_anchors(weight: torch.Tensor,
                       bias: Optional[torch.Tensor] = None,
                       mode: str = 'diagonal') -> torch.Tensor:
    """Structural anchors ``a_k``, one row per class: ``[C, D]``.

    ``diagonal`` (eq:structural_anchor, eq:appendix_anchor): ``a_k = s_k w_k``
    with the structural sensitivity ``s_k = -P_kk (ln P_kk + H_k)``
    (eq:appendix_sk), ``P = softmax(Z)`` row-wise and ``H_k`` the
    self-structural entropy (eq:self_entropy).

    ``full`` (ablation variant): ``a_k = sum_j (dH_k/dZ_kj) w_j``, the whole
    gradient of ``H_k`` w.r.t. the virtual input ``w_k`` with the classifier
    held fixed (eq:appendix_dHk_dZ chained through ``Z_kj = w_j . w_k + b_j``).

    Anchors are constants for the alignment loss: the caller decides whether
    gradients may flow (they are usually computed under ``no_grad``).
    """
    return anchors_from_coefficients(
        weight, anchor_coefficients(weight, bias, mode))


# --------------------------------------------------------------------------
# Phase 2: online sensitivity and the alignment loss
# --------------------------------------------------------------------------
def sample_sensitivity(logits: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """Pseudo-label and logit-level sensitivity, eq:sample_sensitivity.

    ``y = argmax p`` and ``s_t = -p_y (ln p_y + H(p)) = dH/dz_y``.

    Args:
        logits: ``[N, C]`` or ``[N, C, H, W]``.

    Returns:
        ``(s, y)``, each ``[N]`` or ``[N, H, W]``.
    """
    pred = logits.argmax(dim=1, keepdim=True)
    sens = entropy_logit_gradient(logits, dim=1).gather(1, pred)
    return sens.squeeze(1), pred.squeeze(1)


def online_gradient(features: torch.Tensor,
                    logits: torch.Tensor) -> torch.Tensor:
    """``g_t = s_t h_t``, eq:online_gradient: ``[N, D]`` (or ``[N, D, H, W]``).

    This is the analytic entropy gradient w.r.t. the predicted class' weight
    row. The loss below never builds it; it exists for inspection and tests.
    """
    sens, _ = sample_sensitivity(logits)
    return sens.unsqueeze(1) * features


def project_on_anchors(features: torch.Tensor,
                        anchors: torch.Tensor) -> torch.Tensor:
    """``h . a_k`` for every class ``k``: ``[N, C]`` or ``[N, C, H, W]``.

    One matmul / 1x1 conv: the cost of the classifier itself.
    """
    if features.dim() == 2:
        return features @ anchors.t()
    return torch.einsum('ndhw,cd->nchw', features, anchors)


def projections_from_logits(logits: torch.Tensor,
                            coefficients: torch.Tensor,
                            bias: Optional[torch.Tensor] = None
                            ) -> torch.Tensor:
    """``h . a_k`` for every class computed from the logits: with
    ``z = W h + b`` and ``a_k = sum_j V_kj w_j``, ``h . a_k = sum_j V_kj
    (z_j - b_j)`` (``s_k (z_k - b_k)`` for diagonal anchors).

    The same values (and the same gradient w.r.t. ``h`` through ``z``) as
    projecting the features, at ``C`` instead of ``D`` numbers per sample
    and without a second ``D``-sized gradient on the features. Valid only
    when ``logits`` are the classifier's output on the features and the
    classifier weight is not adapted (through ``z`` the loss would reach
    ``W``, which the anchors, constants of the loss, must not).
    """
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
    """``||h||`` over the feature axis (dim 1), with a one-pass backward.

    The values are ``torch.linalg.vector_norm``'s; the gradient is the
    same, ``h * (grad / ||h||)`` (0 where ``||h|| = 0``, as PyTorch's), but
    the ``grad / ||h||`` division and the zero-norm mask run on the small
    ``[N, 1, ...]`` tensor, so the ``D``-sized work is one multiplication
    instead of PyTorch's three passes (multiply, divide, mask): at
    ``D = 768`` over a 135x240 map this norm is most of the STAG term.
    """

    @staticmethod
    def forward(ctx, features):
        # half/bfloat16 features: accumulated in float32 by PyTorch, the
        # [N, 1, ...] result rounded once, then kept in float32 (a float32
        # copy of the D-sized features would cost what it saves)
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
    """``||h||`` per sample (pixel), ``[N, 1]`` or ``[N, 1, H, W]``; see
    :class:`_FeatureNorm`."""
    return _FeatureNorm.apply(features)


def stag_alignment(features: torch.Tensor,
                   logits: torch.Tensor,
                   anchors: torch.Tensor,
                   eps: float = 1e-8,
                   label: str = 'hard',
                   projections: Optional[torch.Tensor] = None
                   ) -> torch.Tensor:
    """Per-sample (per-pixel) alignment loss ``L_STAG(x)``, eq:stag_loss.

    ``hard``: ``-(g . a_y) / (||g|| ||a_y|| + eps)`` with ``g = s h``, computed
    as ``-s (h . a_y) / (|s| ||h|| ||a_y|| + eps)`` so that ``g`` (``N x D``
    per pixel) is never materialised.

    ``soft`` (ablation variant): ``-sum_k p_k cos(s_k h, a_k)`` with
    ``s_k = -p_k (ln p_k + H(p))``, the same ``eps`` in every cosine.

    ``projections``: ``h . a_k`` if already known (see
    :func:`projections_from_logits`); otherwise the features are projected
    on the anchors.

    Returns:
        ``[N]`` or ``[N, H, W]``.
    """
    if label not in LABEL_MODES:
        raise ValueError(f'label must be one of {LABEL_MODES}, got {label!r}')
    if features.dim() == 2 and not features.is_contiguous():
        # a strided view such as a ViT's class token: the norm's backward
        # would keep the whole token map alive; an [N, D] copy is cheap
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


def reduce_batch_loss(per_sample: torch.Tensor,
                      valid_mask: Optional[torch.Tensor] = None
                      ) -> torch.Tensor:
    """Batch loss: the mean over samples (or valid pixels), eq:stag_batch_loss.

    With an all-invalid mask the loss is 0 (connected to the graph so that a
    backward still works).
    """
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
    """``L_STAG(B)`` of eq:stag_batch_loss from forward quantities only.

    Args:
        features: classifier inputs ``h``, ``[N, D]`` or ``[N, D, H, W]``.
        logits: classifier outputs ``z``, ``[N, C]`` or ``[N, C, H, W]``.
        weight: classifier weight ``[C, D]`` or ``[C, D, 1, 1]``.
        bias: classifier bias ``[C]`` or ``None``.
        eps: the ``epsilon`` of eq:stag_loss.
        anchor: ``'diagonal'`` (paper) or ``'full'``.
        label: ``'hard'`` (paper) or ``'soft'``.
        valid_mask: optional bool mask ``[N]`` / ``[N, H, W]``; invalid
            samples/pixels are excluded from the mean.
        anchors: precomputed ``[C, D]`` anchors (skips Phase 1).

    Returns:
        A scalar tensor, differentiable w.r.t. ``features`` and ``logits``.
    """
    weight = check_classifier(weight, bias)
    check_inputs(features, logits, num_classes=weight.shape[0],
                 feature_dim=weight.shape[1], valid_mask=valid_mask)
    if anchors is None:
        with torch.no_grad():
            anchors = structural_anchors(weight, bias, mode=anchor)
    anchors = anchors.detach().to(dtype=features.dtype)
    per_sample = stag_alignment(features, logits, anchors, eps=eps,
                                label=label)
    return check_finite_loss(reduce_batch_loss(per_sample, valid_mask),
                             features=features, logits=logits)


# --------------------------------------------------------------------------
# beta schedule
# --------------------------------------------------------------------------
def stag_beta(beta0: float, gamma: float, step: int) -> float:
    """``beta_t = beta0 exp(-t / gamma)``: eq:adaptive_decay unrolled.

    ``step`` counts update steps from 0 (``beta_0 = beta0``).
    """
    if gamma <= 0:
        raise ValueError(f'gamma must be > 0, got {gamma}')
    if step < 0:
        raise ValueError(f'step must be >= 0, got {step}')
    return float(beta0) * math.exp(-step / float(gamma))
