"""Run state for resuming: random states, fingerprints, one atomic file."""
import hashlib
import json
import os.path as osp
import random
from fnmatch import fnmatchcase
from typing import Any, Dict, List, Sequence

import numpy as np
import torch
import torch.nn as nn

from .report import write_torch

#: version of the state-file layout (a file of another version is refused)
STATE_VERSION = 5


def rng_state() -> dict:
    """Random states of Python, NumPy and torch (CPU, CUDA) as plain data."""
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    version, mt, gauss_next = random.getstate()
    state = dict(torch=torch.get_rng_state(),
                 numpy=dict(kind=kind, keys=torch.from_numpy(
                     keys.astype(np.int64)), pos=int(pos),
                     has_gauss=int(has_gauss), gauss=float(gauss)),
                 python=dict(version=version, mt=list(mt),
                             gauss_next=gauss_next))
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state['cuda'] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    """Restore what :func:`rng_state` returned (``RuntimeError`` if it
    holds CUDA states and CUDA is missing)."""
    torch.set_rng_state(state['torch'])
    n = state['numpy']
    np.random.set_state((n['kind'], n['keys'].numpy().astype(np.uint32),
                         n['pos'], n['has_gauss'], n['gauss']))
    p = state['python']
    random.setstate((p['version'], tuple(p['mt']), p['gauss_next']))
    if 'cuda' in state:
        if not torch.cuda.is_available():
            raise RuntimeError('the run state holds CUDA random states, but '
                               'no CUDA device is available: resume on the '
                               'kind of device that wrote it')
        torch.cuda.set_rng_state_all(state['cuda'])


def flatten_settings(settings: Any, prefix: str = '') -> Dict[str, str]:
    """Flatten nested settings to ``{'a.b.0.c': json_or_repr}`` strings."""
    if isinstance(settings, dict):
        items = [(str(k), v) for k, v in settings.items()]
    elif isinstance(settings, (list, tuple)) and any(
            isinstance(v, (dict, list, tuple)) for v in settings):
        items = [(str(i), v) for i, v in enumerate(settings)]
    else:
        return {prefix: json.dumps(settings, sort_keys=True, default=repr)}
    flat: Dict[str, str] = {}
    for key, value in items:
        flat.update(flatten_settings(value, f'{prefix}.{key}' if prefix
                                     else key))
    return flat


@torch.no_grad()
def run_identity(settings: dict, model: nn.Module) -> dict:
    """A run's identity: its flattened settings, and a device-independent
    SHA-1 of its starting weights (parameters and buffers)."""
    digest = hashlib.sha1()
    for name, tensor in model.state_dict().items():
        tensor = tensor.detach().cpu().contiguous()
        digest.update(f'{name}:{tensor.dtype}:{tuple(tensor.shape)};'.encode())
        digest.update(tensor.view(-1).view(torch.uint8).numpy().tobytes()
                      if tensor.numel() else b'')
    return dict(config=flatten_settings(settings), weights=digest.hexdigest())


def identity_differences(saved: dict, current: dict,
                         ignore: Sequence[str] = ()) -> List[str]:
    """What differs between two :func:`run_identity`, one line each:
    ``'key: saved -> current'`` for each setting not in ``ignore``."""
    old_cfg, new_cfg = saved['config'], current['config']
    diffs = []
    for key in sorted(set(old_cfg) | set(new_cfg)):
        if any(fnmatchcase(key, p) for p in ignore):
            continue
        old, new = old_cfg.get(key, '<absent>'), new_cfg.get(key, '<absent>')
        if old != new:
            diffs.append(f'{key}: {old} -> {new}')
    if saved['weights'] != current['weights']:
        diffs.append('the starting weights (checkpoint): '
                     f"{saved['weights'][:12]} -> {current['weights'][:12]}")
    return diffs


def save_run_state(path: str, state: dict) -> None:
    """Write ``state`` and its ``version`` to ``path`` atomically."""
    save_atomic(dict(state, version=STATE_VERSION), path)


def save_atomic(obj, path: str) -> None:
    """``torch.save(obj, path)``; a crash leaves the old file or the new
    (``report.write_torch``)."""
    write_torch(path, obj)


def load_run_state(path: str, mmap: bool = False) -> dict:
    """Read a file of :func:`save_run_state` with ``weights_only=True``
    (``mmap``: map the tensors, to read the identity alone).

    Raises:
        FileNotFoundError: If there is no such file.
        RuntimeError: If it is corrupt, truncated or of another version.
    """
    if not osp.isfile(path):
        raise FileNotFoundError(f'no run state to resume from: {path}')
    try:
        state = torch.load(path, map_location='cpu', weights_only=True,
                           mmap=mmap)
    except Exception as err:  # zip errors, EOF, unpickling: all "corrupt"
        first = str(err).strip().splitlines()[0] if str(err).strip() else ''
        raise RuntimeError(
            f'cannot resume from {path}: the file is corrupt or truncated '
            f'({type(err).__name__}: {first}). Nothing was changed; delete '
            'it to start the run again from the beginning') from err
    if not isinstance(state, dict) or state.get('version') != STATE_VERSION:
        version = state.get('version') if isinstance(state, dict) else None
        raise RuntimeError(
            f'cannot resume from {path}: state version {version!r}, this '
            f'code reads {STATE_VERSION} (another mmseg_stag wrote it, and '
            'its layout or names differ); delete it to start the run again')
    return state
