"""Helpers of the device tests (``tests/cuda``): every test there runs on
``'cpu'`` (CI) and on ``'cuda'`` (marked ``cuda``: ``make gpu-check``
runs those, CI skips them), with one body.

Runs in this process go through MMEngine's ``Runner`` on the real configs
shrunk by ``--cfg-options`` (as ``tools/test.py`` runs them), with the
model put on the chosen device; runs in a subprocess are ``tools/test.py``
itself, with CUDA hidden for ``'cpu'``."""
import logging
import math
import os
import os.path as osp
import sys
import uuid

import pytest
import tool_runs
import torch
from cls_helpers import options
from run_helpers import killable_config
from seg_helpers import (REPO, SEG_CFG, as_cli, eata_source_options,
                         python_path, tiny_options)

#: the device parameter: the CPU always, CUDA where there is one
DEVICES = ['cpu', pytest.param('cuda', marks=pytest.mark.cuda)]
#: the classification configs (continual CIFAR-10-C; a tiny CNN replaces
#: the WideResNet) and the corruptions of the tiny stream
CLS_CFG = 'configs/cls/cifar-c/cifar10-c_continual_wrn-28-10_{}.py'
CIFAR_NAMES = ('gaussian_noise', 'shot_noise', 'impulse_noise')
#: CoTTA's views on the tiny stream: 6 views (3 ratios x flip)
COTTA_VIEWS = {'test_dataloader.dataset.pipeline.1.scale': (128, 64),
               'test_dataloader.dataset.pipeline.1.ratios': [0.5, 1.0, 1.5]}


def device_precisions(precisions=(None, 'bf16', 'fp16')):
    """``(device, precision)`` parameters: each precision on the CPU and on
    CUDA, except fp16 on the CPU, which the loop refuses before the first
    batch (tested in tests/engine/test_online_loop.py)."""
    params = []
    for precision in precisions:
        for device in ('cpu', 'cuda'):
            if device == 'cpu' and precision == 'fp16':
                continue
            marks = [pytest.mark.cuda] if device == 'cuda' else []
            params.append(pytest.param(device, precision, marks=marks,
                                       id=f'{device}-{precision or "fp32"}'))
    return params


def is_classification(method: str) -> bool:
    return method.startswith('ecotta')


def config_of(method: str, task: str = None) -> str:
    """The real config of a method (``'tent-stag'``, ``'ecotta-k4'``) for
    ``task`` (default: segmentation, classification for EcoTTA)."""
    if task is None:
        task = 'classification' if is_classification(method) \
            else 'segmentation'
    pattern = CLS_CFG if task == 'classification' else SEG_CFG
    return osp.join(REPO, pattern.format(method))


def seg_options(method, tiny_acdc, tiny_cityscapes=None, rounds=1):
    """The tiny model and stream in place of a segmentation config's."""
    opts = tiny_options(tiny_acdc, rounds=rounds)
    if method.startswith('cotta'):
        opts.update(COTTA_VIEWS)
    if method.startswith('eata'):
        opts.update(eata_source_options(tiny_cityscapes))
    return opts


def cls_options(method, root, batch_size=8):
    """The tiny CNN and CIFAR-C stream in place of a classification
    config's (EcoTTA: K=4 meta networks, started cold, as no warm-up ran)."""
    opts = options(root, CIFAR_NAMES, batch_size, n_examples=16)
    if method.startswith('ecotta'):
        opts['model.network'] = dict(
            _delete_=True, type='EcoTTANetwork', K=4, allow_cold_start=True,
            network=dict(type='SmallCNN', num_classes=4, width=4, norm='BN'))
        opts['test_cfg.method.optimizer'] = dict(
            _delete_=True, type='SGD', lr=0.05, momentum=0.9)
    if method in ('source', 'bn-adapt'):
        del opts['test_cfg.method.optimizer']
    return opts


def use_device(monkeypatch, device: str) -> None:
    """Put the models of the runners built in this test on ``device``
    (MMEngine's ``Runner`` takes CUDA whenever there is one)."""
    import mmengine.runner.runner as runner_module
    monkeypatch.setattr(runner_module, 'get_device', lambda: device)


class Run:
    """One stream through MMEngine's ``Runner`` in this process, as
    ``tools/test.py`` runs it, with the dtypes the classifier returned."""

    def __init__(self, config, checkpoint, work_dir, opts):
        from mmengine.config import Config
        from mmengine.runner import Runner

        from mmseg_stag.checkpoint import load_model_checkpoint
        from mmseg_stag.engine.online_loop import runner_model
        from mmseg_stag.engine.online_task import build_task, head_layer_of
        from mmseg_stag.engine.runs import prepare_config
        cfg = Config.fromfile(config)
        cfg.merge_from_dict(opts)
        cfg = prepare_config(cfg, str(work_dir))
        cfg.experiment_name = f'device_{uuid.uuid4().hex[:8]}'
        self.runner = Runner.from_cfg(cfg)
        runner = self.runner
        self.model = runner_model(runner)
        head_layer = head_layer_of(cfg)
        load_model_checkpoint(self.model, checkpoint, head_layer=head_layer)
        task = build_task(self.model, None, head_layer)
        classifier = task.probe.classifier(task.adapted_module(self.model))
        self.dtypes = set()
        classifier.register_forward_hook(
            lambda m, i, out: self.dtypes.add(out.dtype))
        self.work_dir = str(work_dir)
        try:
            self.metrics = runner.test()
        finally:  # many runs in one process: no open log files left
            for handler in list(runner.logger.handlers):
                if isinstance(handler, logging.FileHandler):
                    handler.close()
                    runner.logger.removeHandler(handler)
        self.method = runner.test_loop.method

    def scalars(self) -> dict:
        """The last value of each ``test/`` scalar the loop logged."""
        return {key: float(buffer.current()) for key, buffer in
                self.runner.message_hub.log_scalars.items()
                if key.startswith('test/')}


def assert_finite_on(module, device: str) -> None:
    """Every parameter and floating buffer is finite and on ``device``."""
    for name, tensor in list(module.named_parameters()) + list(
            module.named_buffers()):
        assert tensor.device.type == device, (name, tensor.device)
        if tensor.is_floating_point():
            assert torch.isfinite(tensor).all(), name


def assert_finite_numbers(values: dict) -> None:
    for key, value in values.items():
        assert isinstance(value, (int, float)) and math.isfinite(value), \
            (key, value)


def tensors_of(state, prefix=''):
    """``(path, tensor)`` of every tensor in a nested state."""
    if torch.is_tensor(state):
        yield prefix, state
    elif isinstance(state, dict):
        for key, value in state.items():
            yield from tensors_of(value, f'{prefix}.{key}' if prefix
                                  else str(key))
    elif isinstance(state, (list, tuple)):
        for i, value in enumerate(state):
            yield from tensors_of(value, f'{prefix}[{i}]')


def run_command(cmd, device: str, timeout=600, **env):
    """``cmd`` in a process of its own on ``device`` (CUDA hidden for the
    CPU), one CPU thread, the test-only hooks importable (``env`` adds
    or replaces variables)."""
    full_env = dict(os.environ, OMP_NUM_THREADS='1',
                    PYTHONPATH=python_path(osp.join(REPO, 'tests'), REPO))
    full_env.update(env)
    if device == 'cpu':
        full_env['CUDA_VISIBLE_DEVICES'] = ''
    return tool_runs.run(cmd, capture_output=True, text=True, cwd=REPO,
                         env=full_env, timeout=timeout)


def run_tool(args, device: str, timeout=600, **env):
    """``tools/test.py ARGS`` through :func:`run_command`."""
    return run_command(
        [sys.executable, osp.join(REPO, 'tools/test.py'), *args], device,
        timeout, **env)


def tool_args(config, checkpoint, work_dir, opts, *extra):
    """``tools/test.py`` words: config, checkpoint, work dir, the adapted
    weights saved, ``extra`` and the ``--cfg-options`` (if any)."""
    return [config, checkpoint, '--work-dir', str(work_dir),
            '--save-adapted', osp.join(str(work_dir), 'adapted.pth'),
            *extra] + (['--cfg-options'] + as_cli(opts) if opts else [])


def tool_config(config, folder, task, opts):
    """``(config file, --cfg-options)`` for ``tools/test.py``: the
    classification options (nested dicts) written into a config file with
    the test-only kill hook, the segmentation ones on the command line."""
    if task == 'classification':
        return killable_config(config, opts, folder), {}
    return killable_config(config, {}, folder), opts
