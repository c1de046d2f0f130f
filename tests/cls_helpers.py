"""Helpers shared by the classification tests (``tests/classification``,
``tests/tools``): the real ``configs/cls`` configs shrunk to the tiny CNN
and the tiny CIFAR-C stream by ``--cfg-options``, a config file with the
test-only kill hook, ``tools/test.py`` in a process of its own, the
comparison of an interrupted run with the uninterrupted one, and a tiny
CIFAR-C layout with its checkpoint for the tools' own processes.

A module of its own (``tests`` is on ``pythonpath``), not a test module:
test modules import no other test module. The fixtures (``stream``,
``names``, ``tiny_model``, ``checkpoint``) live in
``tests/classification/conftest.py``."""
import json
import os.path as osp
import sys

import tool_runs
import torch
#: ``run(config, checkpoint, work_dir, cfg_options)``: ``tools/test.py``'s
#: run in the tests' process; returns the run's results
from run_helpers import killable_config, numbers  # noqa: F401
from run_helpers import run_config as run  # noqa: F401

REPO = osp.dirname(osp.dirname(osp.abspath(__file__)))
#: the real classification configs (``.format(method)``)
CIFAR = osp.join(REPO, 'configs/cls/cifar-c/cifar10-c_continual_wrn-28-10_'
                 '{}.py')
IMAGENET = osp.join(REPO, 'configs/cls/imagenet-c/imagenet-c_mild_'
                    'resnet50-bn_{}.py')


def options(root, names, batch_size=16, scenario=None, n_examples=40,
            **extra):
    """The tiny model and stream in place of the config's."""
    opts = {
        'model.network': dict(_delete_=True, type='SmallCNN', num_classes=4,
                              width=4, norm='BN'),
        'model.data_preprocessor': dict(type='ClassifierPreprocessor',
                                        mean=None, std=None),
        'test_dataloader.dataset.corruption_set': dict(
            _delete_=True, type='CIFARC', data_root=root,
            n_examples=n_examples),
        'test_dataloader.dataset.corruptions': list(names),
        'test_dataloader.batch_size': batch_size,
        'test_dataloader.num_workers': 0,
        'default_hooks.logger.interval': 1,
        'test_cfg.method.optimizer': dict(_delete_=True, type='Adam', lr=1e-2),
    }
    if scenario:
        opts['test_dataloader.dataset.scenario'] = dict(type=scenario)
    opts.update(extra)
    return opts


def run_tool(*args, env=None):
    """``tools/test.py ARGS`` in a process of its own."""
    return tool_runs.run([sys.executable, osp.join(REPO, 'tools/test.py'),
                          *args], capture_output=True, text=True, cwd=REPO,
                         env=env)


def assert_same_run(whole, cut):
    """The two work dirs hold the same results and, in ``adapted.pth``, the
    same adapted tensors, bit for bit; returns the adapted state."""
    a, b = [json.load(open(w / 'continual_results.json'))
            for w in (whole, cut)]
    assert numbers(a) == numbers(b)
    pa, pb = [torch.load(w / 'adapted.pth', weights_only=True)['state_dict']
              for w in (whole, cut)]
    assert pa.keys() == pb.keys()
    for key in pa:
        assert torch.equal(pa[key], pb[key]), key
    return pa


def tiny_cifar_c(tmp_path):
    """Two corruptions of 16 random images (4 classes) in CIFAR-C's layout
    and a 4-class SmallCNN checkpoint: ``(root, checkpoint)``."""
    import numpy as np

    from mmseg_stag.classification import SmallCNN
    root = tmp_path / 'cifar-c'
    root.mkdir()
    rng = np.random.default_rng(0)
    np.save(root / 'labels.npy', rng.integers(0, 4, 5 * 16))
    for name in ('gaussian_noise', 'shot_noise'):
        np.save(root / f'{name}.npy',
                rng.integers(0, 256, (5 * 16, 32, 32, 3), dtype=np.uint8))
    torch.manual_seed(0)
    ckpt = str(tmp_path / 'tiny_cnn.pth')
    torch.save({'state_dict': SmallCNN(num_classes=4, width=4).state_dict()},
               ckpt)
    return root, ckpt
