"""Deterministic mode and the CUDA math switches of an online run
(docs/running.md: what ``--deterministic`` changes and what remains)."""
import logging
from typing import Dict, Optional

import torch
from mmengine.logging import print_log

#: this project's ops still nondeterministic on CUDA: op -> where it is
#: called (tests/segmentation/test_determinism.py records them; PyTorch's
#: whole list is the tests': tests/nondeterministic_ops.py)
REMAINING_NONDETERMINISTIC_OPS: Dict[str, str] = {
    'nll_loss2d_forward':
    "tent loss='pseudo_ce' on per-pixel logits: mmseg_stag/core/losses.py "
    'pseudo_label_cross_entropy',
}


def configure_determinism(logger: Optional[logging.Logger] = None,
                          warn_only: bool = True) -> bool:
    """In deterministic mode, switch to ``warn_only`` (so that an op of
    :data:`REMAINING_NONDETERMINISTIC_OPS`, or an unknown one, warns rather
    than stops the run) and log the remaining ops, cuDNN's and TF32 flags
    (docs/running.md); return whether deterministic mode is on."""
    if not torch.are_deterministic_algorithms_enabled():
        return False
    torch.use_deterministic_algorithms(True, warn_only=warn_only)
    remaining = ', '.join(f'{op} ({where})' for op, where in
                          REMAINING_NONDETERMINISTIC_OPS.items()) or 'none'
    print_log(
        f'deterministic mode ({"warn_only" if warn_only else "strict"}): '
        f'ops without a deterministic CUDA kernel that may remain: '
        f'{remaining}; cudnn.deterministic='
        f'{torch.backends.cudnn.deterministic}, cudnn.benchmark='
        f'{torch.backends.cudnn.benchmark}, {tf32_state()}',
        logger=logger or 'current')
    return True


def configure_cuda_math(tf32: Optional[bool] = None) -> None:
    """Set whether float32 matmuls and cuDNN convolutions may use TF32
    (None: PyTorch's settings; docs/running.md) by the ``allow_tf32`` flags
    that ``tools/gpu_check.py`` and MMCV read (torch 2.13 refuses to read
    them once its ``fp32_precision`` settings were used: do not mix)."""
    if tf32 is None:
        return
    torch.backends.cuda.matmul.allow_tf32 = bool(tf32)
    torch.backends.cudnn.allow_tf32 = bool(tf32)


def tf32_state() -> str:
    """``'tf32 matmul=..., tf32 cudnn=...'`` for the log line and the
    results' provenance."""
    try:
        matmul = torch.backends.cuda.matmul.allow_tf32
        cudnn = torch.backends.cudnn.allow_tf32
    except RuntimeError:  # the fp32_precision API was used: read that one
        matmul = torch.backends.cuda.matmul.fp32_precision
        cudnn = torch.backends.cudnn.conv.fp32_precision
    return f'tf32 matmul={matmul}, tf32 cudnn={cudnn}'
