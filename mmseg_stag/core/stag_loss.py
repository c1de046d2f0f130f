"""``STAGLoss``: the STAG alignment loss as a plain ``nn.Module``; how a
method's ``stag`` config builds it, and the anchors' signs it logs when it
is configured (eq:structural_anchor)."""
from typing import Optional, Tuple

import torch
import torch.nn as nn
from mmengine.logging import print_log

from . import stag


class STAGLoss(nn.Module):
    """STAG loss ``L_STAG(B)`` (eq:stag_batch_loss).

    Args:
        eps (float): The ``epsilon`` of eq:stag_loss. Default: 1e-8.
        anchor (str): ``'diagonal'`` (paper) or ``'full'``.
            Default: ``'diagonal'``.
        label (str): ``'hard'`` (paper) or ``'soft'``. Default: ``'hard'``.
        check_finite (bool): Raise at once on nan/inf in the classifier or
            the loss (each check waits for the device; the online methods
            turn it off, the loop checks ``loss_stag``). Default: True.

    Raises:
        ValueError: If ``anchor``, ``label`` or ``eps`` is invalid.
    """

    def __init__(self,
                 eps: float = 1e-8,
                 anchor: str = 'diagonal',
                 label: str = 'hard',
                 check_finite: bool = True):
        super().__init__()
        for name, value, modes in (('anchor', anchor, stag.ANCHOR_MODES),
                                   ('label', label, stag.LABEL_MODES)):
            if value not in modes:
                raise ValueError(f'STAGLoss: {name} must be one of {modes}, '
                                 f'got {value!r}')
        if not eps >= 0:
            raise ValueError(f'STAGLoss: eps must be >= 0, got {eps}')
        self.eps = float(eps)
        self.anchor = anchor
        self.label = label
        self.check_finite = bool(check_finite)
        self._anchor_key: Optional[Tuple] = None
        self._anchors: Optional[torch.Tensor] = None
        self._coefficients: Optional[torch.Tensor] = None
        self.anchor_computations = 0
        self._checked_shapes: Optional[Tuple] = None

    @staticmethod
    def _tensor_key(tensor: Optional[torch.Tensor]) -> Tuple:
        if tensor is None:
            return (None, )
        # ``_version`` is bumped by every in-place update (optimizer steps);
        # torch has no public accessor of this counter, and a copy or a
        # hash of the weights per step would cost what the cache saves
        return (tensor.data_ptr(), tensor._version, tuple(tensor.shape),
                tensor.dtype, tensor.device)

    def anchors(self, cls_weight: torch.Tensor,
                cls_bias: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Structural anchors ``[C, D]`` of this classifier, cached."""
        self._update_anchors(cls_weight, cls_bias)
        return self._anchors

    def anchor_coefficients(self, cls_weight: torch.Tensor,
                            cls_bias: Optional[torch.Tensor] = None
                            ) -> torch.Tensor:
        """Coefficients ``V`` of the anchors, cached with them."""
        self._update_anchors(cls_weight, cls_bias)
        return self._coefficients

    def _update_anchors(self, cls_weight, cls_bias) -> None:
        """Recompute the anchors if the classifier changed."""
        key = self._tensor_key(cls_weight) + self._tensor_key(cls_bias)
        if self._anchors is None or key != self._anchor_key:
            with torch.no_grad():
                weight = cls_weight.detach()
                self._coefficients = stag.anchor_coefficients(
                    weight, None if cls_bias is None else cls_bias.detach(),
                    mode=self.anchor, check_finite=self.check_finite)
                self._anchors = stag.anchors_from_coefficients(
                    weight, self._coefficients)
            self._anchor_key = key
            self.anchor_computations += 1

    def forward(self,
                features: torch.Tensor,
                logits: torch.Tensor,
                cls_weight: torch.Tensor,
                cls_bias: Optional[torch.Tensor] = None) -> torch.Tensor:
        """``L_STAG(B)``, the mean over samples (pixels), of the classifier's
        inputs ``[N, D(, H, W)]`` and outputs ``[N, C(, H, W)]`` of one
        pass; ``cls_weight`` ``[C, D]`` or ``[C, D, 1, 1]``."""
        # the shapes once per shape; with check_finite, the classifier's
        # values at every call
        key = tuple(tuple(t.shape) if t is not None else None
                    for t in (features, logits, cls_weight, cls_bias))
        if self.check_finite or key != self._checked_shapes:
            weight = stag.check_classifier(cls_weight, cls_bias,
                                           check_finite=self.check_finite)
            stag.check_inputs(features, logits, num_classes=weight.shape[0],
                              feature_dim=weight.shape[1])
            self._checked_shapes = key
        # float32 for the C-sized tensors; D-sized features are not copied
        dtype = torch.float32 if features.dtype in (
            torch.float16, torch.bfloat16) else features.dtype
        with torch.autocast(device_type=features.device.type, enabled=False):
            logits = logits.to(dtype)
            anchors = self.anchors(cls_weight, cls_bias).to(dtype)
            # a frozen W lets the logits stand in for the features
            frozen = not cls_weight.requires_grad
            loss = stag.batch_alignment(
                features, logits, anchors, eps=self.eps, label=self.label,
                coefficients=self._coefficients if frozen else None,
                bias=cls_bias)
            if self.check_finite:
                stag.check_finite_loss(loss, features=features, logits=logits)
        return loss

    def extra_repr(self) -> str:
        return (f'eps={self.eps}, anchor={self.anchor!r}, '
                f'label={self.label!r}')


def build_stag_loss(stag_cfg: Optional[dict]) -> Optional[STAGLoss]:
    """The ``STAGLoss`` of a method's ``stag`` config (None: no STAG);
    ``ValueError`` if it lacks ``beta0`` or ``gamma``, or they are out of
    range (:func:`~.stag.stag_beta`)."""
    if stag_cfg is None:
        return None
    missing = {'beta0', 'gamma'} - set(stag_cfg)
    if missing:
        raise ValueError(f'stag config needs {sorted(missing)}, got '
                         f'{stag_cfg}')
    stag.stag_beta(stag_cfg['beta0'], stag_cfg['gamma'], 0)
    return STAGLoss(**stag_loss_options(stag_cfg))


def stag_loss_options(stag_cfg: dict) -> dict:
    """The ``STAGLoss`` arguments of a method's ``stag`` config;
    ``check_finite`` off by default (no wait for the device: the loop
    checks every logged statistic, ``loss_stag`` among them, when it reads
    them).

    Raises:
        ValueError: If ``type`` names another loss than ``STAGLoss``.
    """
    kind = stag_cfg.get('type', 'STAGLoss')
    if kind != 'STAGLoss':
        raise ValueError(f"stag.type={kind!r}: a method's STAG term is "
                         "STAGLoss (the only type; leave it out)")
    return {'check_finite': False, **{
        k: v for k, v in stag_cfg.items()
        if k not in ('beta0', 'gamma', 'type')}}


@torch.no_grad()
def log_anchor_signs(classifier: nn.Module) -> Tuple[int, float, float]:
    """Log and return the number of classes with ``s_k > 0``
    (eq:structural_anchor) and the range of ``s_k``."""
    weight = classifier.weight.detach().flatten(1).double()
    bias = None if classifier.bias is None else classifier.bias.detach()
    s = stag.anchor_coefficients(
        weight, None if bias is None else bias.double())
    positive = int((s > 0).sum())
    lo, hi = float(s.min()), float(s.max())
    print_log(f'STAG anchors: {positive} of {s.numel()} classes have s_k > 0 '
              f'(anchor pointing away from w_k); s_k in [{lo:.4g}, {hi:.4g}]',
              logger='current')
    return positive, lo, hi
