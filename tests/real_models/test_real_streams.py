"""Every method of the paper's tables, with and without STAG, on the real
networks (random weights) through tools/test.py's run and the paper's own
configs: two stages of a tiny ImageNet-C layout (2 images of 2 classes per
corruption: one batch, 224x224 after the resize/crop) for ResNet-50-BN/-GN and
ViT-B/16; the continual CIFAR-C configs on the WRNs (EATA and CoTTA on one
corruption)."""
import json
import os
import os.path as osp

import numpy as np
import pytest
from real_model_helpers import REPO, need, save, source

need('torchvision')
need('timm')

from run_helpers import run_config as run  # noqa: E402

SOME_CORRUPTIONS = ['gaussian_noise', 'shot_noise']
WNIDS = ['n01440764', 'n01443537']


@pytest.fixture(scope='module')
def imagenet_c(tmp_path_factory):
    """``<root>/<corruption>/5/<wnid>/*.JPEG`` and a clean ``val`` folder
    (EATA's Fisher), 64x64 JPEGs."""
    from PIL import Image
    root = tmp_path_factory.mktemp('imagenet_c')
    rng = np.random.default_rng(0)
    for folder in [osp.join(c, '5') for c in SOME_CORRUPTIONS] + ['val']:
        for wnid in WNIDS:
            os.makedirs(root / folder / wnid)
            Image.fromarray(rng.integers(0, 256, (64, 64, 3),
                                         dtype=np.uint8)).save(
                root / folder / wnid / 'img_0.JPEG')
    return str(root)


@pytest.fixture(scope='module')
def cifar_c(tmp_path_factory):
    root = tmp_path_factory.mktemp('cifar_c')
    rng = np.random.default_rng(1)
    np.save(root / 'labels.npy', rng.integers(0, 10, 5 * 4))
    for c in SOME_CORRUPTIONS:
        np.save(root / f'{c}.npy', rng.integers(0, 256, (5 * 4, 32, 32, 3),
                                                dtype=np.uint8))
    return str(root)


@pytest.fixture(scope='module')
def weights(tmp_path_factory):
    """One random weight file per network, saved as its users have it."""
    folder = tmp_path_factory.mktemp('weights')
    files = {}
    for base, name in (('resnet50-bn', 'resnet50.pth'),
                       ('resnet50-gn', 'resnet50_gn.safetensors'),
                       ('vit-b16', 'vit_b16.safetensors'),
                       ('wrn-28-10', 'Standard.pt'),
                       ('wrn-40-2', 'Hendrycks2020AugMix_WRN.pt')):
        files[base] = str(folder / name)
        save(source(base), files[base])
    return files


#: the paper's ImageNet-C rows (no TENT row for ResNet-50-GN)
IMAGENET = [(model, method) for model in ('resnet50-bn', 'resnet50-gn',
                                          'vit-b16')
            for method in ('tent', 'eata', 'sar', 'deyo')
            if (model, method) != ('resnet50-gn', 'tent')]


@pytest.mark.parametrize('model,method', IMAGENET)
def test_imagenet_c_methods(tmp_path, imagenet_c, weights, model, method):
    options = {
        'test_dataloader.dataset.corruption_set.data_root': imagenet_c,
        'test_dataloader.dataset.corruptions': SOME_CORRUPTIONS,
        'test_dataloader.batch_size': 2,
        'test_dataloader.num_workers': 0,
    }
    if method == 'eata':  # Fisher from the clean folder, one corruption
        options.update({
            'test_dataloader.dataset.corruptions': SOME_CORRUPTIONS[:1],
            'test_cfg.source_dataloader.dataset.images.data_root':
                osp.join(imagenet_c, 'val'),
            'test_cfg.source_dataloader.dataset.images.n_examples': 4,
            'test_cfg.source_dataloader.batch_size': 2,
            'test_cfg.source_dataloader.num_workers': 0})
    stages = len(options['test_dataloader.dataset.corruptions'])
    for leaf in (method, f'{method}-stag'):
        config = osp.join(REPO, 'configs/cls/imagenet-c/imagenet-c_mild_'
                          f'{model}_{leaf}.py')
        res = run(config, weights[model], tmp_path / leaf, options)
        assert [s['num_images'] for s in res['stages']] == [2] * stages
        if leaf.endswith('-stag'):  # L_STAG covers every image: updates
            assert res['num_updates'] >= stages


CIFAR = [('wrn-28-10', 'cifar10-c', m) for m in
         ('bn-adapt', 'tent', 'cotta', 'ecotta-k4')] + \
    [('wrn-40-2', 'cifar100-c', m) for m in
     ('bn-adapt', 'tent', 'cotta', 'ecotta-k5')]


@pytest.mark.parametrize('model,benchmark,method', CIFAR)
def test_cifar_c_methods(tmp_path, cifar_c, weights, model, benchmark,
                         method):
    options = {
        'test_dataloader.dataset.corruption_set.data_root': cifar_c,
        'test_dataloader.dataset.corruption_set.n_examples': 4,
        'test_dataloader.dataset.corruptions': SOME_CORRUPTIONS,
        'test_dataloader.batch_size': 2,
        'test_dataloader.num_workers': 0,
    }
    if method == 'cotta':
        options.update({'test_dataloader.dataset.corruptions':
                        SOME_CORRUPTIONS[:1], 'test_cfg.method.num_augs': 2})
    if method.startswith('ecotta'):  # no warm-up here: a cold start
        options['model.network.allow_cold_start'] = True
    stages = len(options['test_dataloader.dataset.corruptions'])
    for leaf in (method, f'{method}-stag'):
        config = osp.join(REPO, f'configs/cls/cifar-c/{benchmark}_continual_'
                          f'{model}_{leaf}.py')
        res = run(config, weights[model], tmp_path / leaf, options)
        assert [s['num_images'] for s in res['stages']] == [4] * stages
        if leaf.endswith('-stag'):
            assert res['num_updates'] >= 2 * stages


def test_tools_test_py_runs_a_real_model(tmp_path, imagenet_c, weights):
    """The command users type, in a process of its own: ViT-B/16 SAR+STAG
    from its .safetensors; then a checkpoint with a 10-class head fails
    naming the file and the key, before any image is adapted."""
    import subprocess
    import sys
    config = osp.join(REPO, 'configs/cls/imagenet-c/'
                      'imagenet-c_mild_vit-b16_sar-stag.py')
    options = ['--cfg-options',
               f'test_dataloader.dataset.corruption_set.data_root='
               f'{imagenet_c}',
               'test_dataloader.dataset.corruptions=[' +
               ','.join(SOME_CORRUPTIONS) + ']',
               'test_dataloader.batch_size=2',
               'test_dataloader.num_workers=0']

    def test_py(checkpoint, work_dir):
        return subprocess.run(
            [sys.executable, osp.join(REPO, 'tools/test.py'), config,
             checkpoint, '--work-dir', str(work_dir)] + options,
            cwd=REPO, capture_output=True, text=True)

    done = test_py(weights['vit-b16'], tmp_path / 'run')
    assert done.returncode == 0, done.stderr[-3000:]
    with open(tmp_path / 'run' / 'continual_results.json') as f:
        res = json.load(f)
    assert [s['num_images'] for s in res['stages']] == [2, 2]

    import timm
    import torch
    wrong = str(tmp_path / 'vit_10_classes.pth')
    torch.save(timm.create_model('vit_base_patch16_224', pretrained=False,
                                 num_classes=10).state_dict(), wrong)
    failed = test_py(wrong, tmp_path / 'wrong')
    assert failed.returncode != 0
    assert 'vit_10_classes.pth' in failed.stderr
    assert 'head.weight' in failed.stderr, failed.stderr[-3000:]
    assert not osp.exists(tmp_path / 'wrong' / 'continual_results.json')
