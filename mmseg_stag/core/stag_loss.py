"""``STAGLoss``: the STAG alignment loss as a plain ``nn.Module``."""
import importlib.util
from typing import List, Optional, Tuple

import torch
import torch.nn as nn

from . import stag
from .losses import mean_over_outputs


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
        analytic_backward (bool, optional): Hard labels through
            :class:`~mmseg_stag.core.stag.HardAlignment` (its gradient
            written out) instead of autograd; equal up to rounding. None:
            on a CUDA device only (docs/stag-loss.md). Default: None.
        compile (bool): The hard-label math through ``torch.compile``;
            implies the analytic backward. Default: False.
        triton (bool): The hard-label math as two Triton kernels, one
            launch each way (mmseg_stag/core/stag_triton.py; CUDA
            tensors); implies the analytic backward. Default: False.

    Raises:
        ValueError: If ``anchor``, ``label`` or ``eps`` is invalid, or the
            options contradict each other.
        ImportError: ``triton=True`` without the ``triton`` package.
    """

    def __init__(self,
                 eps: float = 1e-8,
                 anchor: str = 'diagonal',
                 label: str = 'hard',
                 check_finite: bool = True,
                 analytic_backward: Optional[bool] = None,
                 compile: bool = False,
                 triton: bool = False):
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
        for name, value in (('compile', compile), ('triton', triton)):
            if value and (analytic_backward is False or label != 'hard'):
                raise ValueError(
                    f'STAGLoss: {name}=True needs the analytic backward '
                    "(analytic_backward True or None, label='hard')")
        if compile and triton:
            raise ValueError('STAGLoss: compile=True and triton=True '
                             'exclude each other')
        if triton and importlib.util.find_spec('triton') is None:
            raise ImportError('STAGLoss(triton=True) needs the triton '
                              'package (CUDA builds of torch bring it)')
        self.analytic_backward = None if analytic_backward is None \
            else bool(analytic_backward)
        self.compile = bool(compile)
        self.triton = bool(triton)
        self.kernels = 'triton' if triton else \
            'compiled' if compile else 'eager'
        self._anchor_key: Optional[Tuple] = None
        self._anchors: Optional[torch.Tensor] = None
        self._coefficients: Optional[torch.Tensor] = None
        self.anchor_computations = 0
        self._hard_key: Optional[Tuple] = None
        self._hard_inputs: Optional[Tuple] = None
        self._checked_shapes: Optional[Tuple] = None

    @staticmethod
    def _tensor_key(tensor: Optional[torch.Tensor]) -> Tuple:
        if tensor is None:
            return (None, )
        # ``_version`` is bumped by every in-place update (optimizer steps)
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

    def _hard_alignment_inputs(self, cls_weight, cls_bias, dtype,
                               feature_dtype) -> Tuple:
        """``HardAlignment``'s classifier inputs, cached with the anchors."""
        self._update_anchors(cls_weight, cls_bias)
        frozen = not cls_weight.requires_grad
        key = (self._anchor_key, frozen, dtype, feature_dtype)
        if key != self._hard_key:
            with torch.no_grad():
                # the cached anchors: not computed a second time
                table, matrix, on_features = stag.hard_alignment_inputs(
                    self._anchors, self._coefficients,
                    None if cls_bias is None else cls_bias.detach(), frozen)
                if matrix is not None:
                    matrix = matrix.to(feature_dtype if on_features
                                       else dtype)
                table = table.to(dtype)
                # made on the device: no copy from the host
                eps_tensor = table.new_full((), self.eps)
            self._hard_inputs = (table, self.eps, eps_tensor, matrix,
                                 on_features)
            self._hard_key = key
        return self._hard_inputs

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
        if self.triton:
            from .stag_triton import check_device
            check_device(features)
        # float32 for the C-sized tensors; D-sized features are not copied
        dtype = torch.float32 if features.dtype in (
            torch.float16, torch.bfloat16) else features.dtype
        with torch.autocast(device_type=features.device.type, enabled=False):
            logits = logits.to(dtype)
            analytic = self.compile or self.triton or (features.is_cuda
                                        if self.analytic_backward is None
                                        else self.analytic_backward)
            if analytic and self.label == 'hard':
                # a bias trained beside a frozen W: its gradient
                bias = cls_bias if cls_bias is not None and \
                    cls_bias.requires_grad and \
                    not cls_weight.requires_grad else None
                loss = stag.hard_alignment(
                    features, logits, *self._hard_alignment_inputs(
                        cls_weight, cls_bias, dtype, features.dtype),
                    bias=bias, kernels=self.kernels)
            else:
                loss = self._autograd_loss(features, logits, cls_weight,
                                           cls_bias, dtype)
            if self.check_finite:
                stag.check_finite_loss(loss, features=features, logits=logits)
        return loss

    def _autograd_loss(self, features, logits, cls_weight, cls_bias, dtype):
        """The loss through autograd (soft labels; the reference)."""
        anchors = self.anchors(cls_weight, cls_bias).to(dtype)
        # a frozen W lets the logits stand in for the features
        frozen = not cls_weight.requires_grad
        return stag.batch_alignment(
            features, logits, anchors, eps=self.eps, label=self.label,
            coefficients=self._coefficients if frozen else None,
            bias=cls_bias)

    def over_outputs(self, head_outputs, cls_weight: torch.Tensor,
                     cls_bias: Optional[torch.Tensor] = None
                     ) -> torch.Tensor:
        """``L_STAG(B)`` over every sample (pixel) of a forward pass: each
        ``(features, logits)`` pair's (one per classifier call) weighted by
        its number of samples."""
        if len(head_outputs) == 1:  # whole inference: one call, no weights
            return self(*head_outputs[0], cls_weight, cls_bias)
        return mean_over_outputs(
            lambda f, z: self(f, z, cls_weight, cls_bias), head_outputs)

    def extra_repr(self) -> str:
        return (f'eps={self.eps}, anchor={self.anchor!r}, '
                f'label={self.label!r}, '
                f'analytic_backward={self.analytic_backward}, '
                f'compile={self.compile}, triton={self.triton}')
