"""Run state for resuming: random states, fingerprints, one atomic file;
the online loop's state at a stage's end and its resume."""
import hashlib
import json
import os.path as osp
import random
from fnmatch import fnmatchcase
from typing import Any, Dict, List, Sequence, Tuple

import numpy as np
import torch
import torch.nn as nn
from mmengine.logging import print_log

from .report import write_torch

#: the run state a resumable stream saves at every stage boundary
STATE_FILE = 'online_adaptation_state.pth'
#: config keys a resumed run may change (they do not change its numbers)
RESUME_IGNORES = ('work_dir', 'launcher', 'experiment_name',
                  'test_cfg.resume', 'test_cfg.save_state', '*num_workers',
                  '*persistent_workers', '*pin_memory', 'default_hooks.*',
                  'visualizer.*', 'vis_backends*', 'log_processor.*',
                  'log_level', 'env_cfg.*')
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
    write_torch(path, dict(state, version=STATE_VERSION))


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


# ------------------------------------------- the online loop's run state


def check_stateful(metrics: Sequence, save_state: bool,
                   resume: bool) -> bool:
    """Return whether the loop's run state can be saved: every metric
    keeps a ``state_dict`` (the ``StreamMetric`` ones); ``ValueError`` for
    a ``resume`` whose metrics keep none."""
    if not (save_state or resume):
        return False
    lacking = [type(m).__name__ for m in metrics
               if not hasattr(m, 'state_dict')]
    if lacking and resume:
        raise ValueError(f'cannot resume: the metric(s) {lacking} keep '
                         'no state_dict (the StreamMetric ones do)')
    if lacking:
        print_log(f'run state not saved: the metric(s) {lacking} keep no '
                  'state_dict, so this run cannot be resumed',
                  logger='current', level=30)
    return not lacking


def stage_end_state(identity: dict, batches_done: int, num_batches: int,
                    method, num_updates_before: int, metrics: Sequence
                    ) -> dict:
    """What the loop saves at a stage's end (:func:`save_run_state`):
    the run's identity, the batches done of how many, the method's and
    the metrics' states, the updates of methods that earlier from-source
    stages replaced, the random states."""
    return dict(identity=identity, batches_done=int(batches_done),
                num_batches=int(num_batches), method=method.state_dict(),
                num_updates_before=int(num_updates_before),
                metrics=[m.state_dict() for m in metrics], rng=rng_state())


def resume_state(path: str, identity: dict, num_batches: int, method,
                 metrics: Sequence) -> Tuple[int, int, dict]:
    """Restore ``method`` and ``metrics`` from :func:`stage_end_state` at
    ``path``; return the batches done, the updates before and the random
    states to set (``ValueError`` if the state is another run's or
    stream's)."""
    state = load_run_state(path)
    diffs = identity_differences(state['identity'], identity,
                                 RESUME_IGNORES)
    if diffs:
        raise ValueError(
            f'cannot resume from {path}: it was written by another run '
            f'({len(diffs)} difference(s)):\n  ' + '\n  '.join(diffs)
            + '\nUse the same config and checkpoint, or another '
            '--work-dir for a new run.')
    if state['num_batches'] != num_batches:
        raise ValueError(f'cannot resume from {path}: it holds a stream '
                         f"of {state['num_batches']} batches, this one "
                         f'has {num_batches}')
    if len(state['metrics']) != len(metrics):
        raise ValueError(f'cannot resume from {path}: '
                         f"{len(state['metrics'])} metric state(s) for "
                         f'{len(metrics)} metric(s)')
    method.load_state_dict(state['method'])
    for metric, metric_state in zip(metrics, state['metrics']):
        metric.load_state_dict(metric_state)
    done = state['batches_done']
    print_log(f'resumed from {path}: {done} of {num_batches} batches done '
              f'(stage {method.stage_index})', logger='current')
    return done, int(state['num_updates_before']), state['rng']
