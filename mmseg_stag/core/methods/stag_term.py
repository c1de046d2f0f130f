"""STAG's term in a method, around :class:`BaseMethod`: the ``STAGLoss``
arguments of its ``stag`` config, and the anchors' signs it logs when it
is configured (eq:structural_anchor)."""
from typing import Optional, Tuple

import torch
import torch.nn as nn
from mmengine.logging import print_log

from ..stag import anchor_coefficients, stag_beta
from ..stag_loss import STAGLoss


def build_stag_loss(stag_cfg: Optional[dict]) -> Optional[STAGLoss]:
    """The ``STAGLoss`` of a method's ``stag`` config (None: no STAG);
    ``ValueError`` if it lacks ``beta0`` or ``gamma``, or they are out of
    range (:func:`~..stag.stag_beta`)."""
    if stag_cfg is None:
        return None
    missing = {'beta0', 'gamma'} - set(stag_cfg)
    if missing:
        raise ValueError(f'stag config needs {sorted(missing)}, got '
                         f'{stag_cfg}')
    stag_beta(stag_cfg['beta0'], stag_cfg['gamma'], 0)
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
    s = anchor_coefficients(weight, None if bias is None else bias.double())
    positive = int((s > 0).sum())
    lo, hi = float(s.min()), float(s.max())
    print_log(f'STAG anchors: {positive} of {s.numel()} classes have s_k > 0 '
              f'(anchor pointing away from w_k); s_k in [{lo:.4g}, {hi:.4g}]',
              logger='current')
    return positive, lo, hi
