"""What a run's numbers came from, written with them (the ``provenance``
key of ``continual_results.json``, docs/running.md): the code, the
environment, the device, the config and its speed options, the seed, and
the run's wall time."""
import os
import os.path as osp
import platform
import subprocess
import sys
from typing import Optional

import torch


def code_version() -> dict:
    """``version`` of mmseg_stag, and ``commit``, ``describe`` and
    ``dirty`` (tracked files changed) of the git checkout it is imported
    from; the three are None for an installed copy outside a checkout."""
    from mmseg_stag import __version__

    # mmseg_stag/engine/provenance.py -> the checkout holding mmseg_stag
    root = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
    found = dict(version=__version__, commit=None, describe=None, dirty=None)

    def git(*args) -> Optional[str]:
        try:
            done = subprocess.run(['git', '-C', root, *args], timeout=30,
                                  capture_output=True, text=True)
        except (OSError, subprocess.TimeoutExpired):  # no git here
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    top = git('rev-parse', '--show-toplevel', 'HEAD')
    # only the package's own checkout: not a repository it happens to be in
    if top is None or osp.realpath(top.split('\n')[0]) != osp.realpath(root):
        return found
    describe = git('describe', '--always', '--dirty', '--abbrev=12')
    return dict(found, commit=top.split('\n')[1], describe=describe,
                dirty=None if describe is None else
                describe.endswith('-dirty'))


def versions() -> dict:
    """Python, torch, CUDA, cuDNN, MMCV, MMEngine and MMSeg versions; an
    OpenMMLab package this run did not import is None (a classification
    run needs neither MMSeg nor MMCV, installed or not)."""
    found = dict(python=platform.python_version(), torch=torch.__version__,
                 cuda=torch.version.cuda,
                 cudnn=torch.backends.cudnn.version())
    for name in ('mmcv', 'mmengine', 'mmseg'):
        module = sys.modules.get(name)
        found[name] = None if module is None else module.__version__
    return found


def device_name(device: torch.device) -> str:
    """The GPU's name, or the CPU's model (``/proc/cpuinfo``, else what
    ``platform`` tells)."""
    if device.type == 'cuda':
        return torch.cuda.get_device_name(device)
    try:
        with open('/proc/cpuinfo') as f:
            for line in f:
                if line.split(':', 1)[0].strip() == 'model name':
                    return line.split(':', 1)[1].strip()
    except OSError:  # not Linux
        pass
    return platform.processor() or platform.machine() or sys.platform


def plain(value):
    """``value`` as JSON holds it: dicts, lists, numbers, strings; any
    other object by its ``repr`` (a class given as a method's type)."""
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return repr(value)


def cpu_kernels() -> dict:
    """The CPU kernel path of this process: ATen's capability (``AVX512``,
    ``AVX2``, ``DEFAULT``), its intra-op threads, and whether the demos'
    pin (``demo_data/kernel_paths.py``: every library's path fixed, the
    same digits on every x86-64 processor) was in force."""
    return dict(aten=torch.backends.cpu.get_cpu_capability(),
                threads=torch.get_num_threads(),
                pinned=os.environ.get('MMSEG_STAG_KERNEL_PATHS') == 'pinned')


def run_provenance(cfg, device: torch.device, method: dict, speed: dict,
                   seed, seconds: float, images: int,
                   resumed_at_batch: Optional[int]) -> dict:
    """The ``provenance`` of an online run (docs/running.md).

    Args:
        cfg (Config): The run's config (its file, its test dataset).
        device (torch.device): Where the model ran.
        method (dict): ``test_cfg.method``: its type, options and ``stag``.
        speed (dict): ``mixed_precision``, ``preset``, ``cuda_graph`` and
            ``tf32`` as the loop runs them.
        seed: The runner's seed.
        seconds (float): The loop's wall time in this process.
        images (int): The images this process ran (after the resume).
        resumed_at_batch (int, optional): The batches done before a resume;
            None for a run from the start.
    """
    from .determinism import tf32_state
    dataset = dict(cfg.get('test_dataloader', {}).get('dataset', {}))
    dataset.pop('pipeline', None)  # the transforms: the config has them
    return plain(dict(
        mmseg_stag=code_version(), versions=versions(),
        device=dict(type=device.type, name=device_name(device)),
        cpu_kernels=cpu_kernels(),
        config=osp.basename(cfg.filename) if cfg.filename else None,
        method=method, dataset=dataset, **speed, tf32_state=tf32_state(),
        seed=seed, deterministic=torch.are_deterministic_algorithms_enabled(),
        cudnn_benchmark=torch.backends.cudnn.benchmark,
        resumed=resumed_at_batch is not None,
        resumed_at_batch=resumed_at_batch, seconds=round(seconds, 3),
        images=int(images),
        images_per_second=round(images / max(seconds, 1e-9), 3)))
