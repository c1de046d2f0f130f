"""Held-out check of the authors' per-model settings on the real networks:
the parameters SAR and DeYO adapt (a transcription of their
``collect_params``, the same function in both repositories: norm layers'
weight and bias, skipping ResNet ``layer4``, ViT ``blocks.9``-``blocks.11``
and the final ``norm``) and TENT and EATA adapt (SAR's ``tent.py`` /
``eata.py``: every BN/GN/LN affine) equal, in order, the ones our methods
select from the configs' defaults; every ImageNet-C config's learning rate
follows SAR's ``main.py`` rule (ResNets ``0.00025 * B / 64``, doubled
below 32; ViT ``0.001 * B / 64``; SGD momentum 0.9); EATA's Fisher
information on the real networks equals a float64 transcription of the
loop in SAR's ``main.py``."""
import glob
import os.path as osp

import pytest
import torch.nn as nn
from mmengine.config import Config
from real_model_helpers import REPO, need, source

torchvision = need('torchvision')
timm = need('timm')


def authors_collect_params(model):
    """SAR's / DeYO's ``collect_params`` (their ``sar.py`` / ``deyo.py``),
    the names in their order."""
    names = []
    for nm, m in model.named_modules():
        if 'layer4' in nm or 'blocks.9' in nm or 'blocks.10' in nm or \
                'blocks.11' in nm or 'norm.' in nm or nm in ['norm']:
            continue
        if isinstance(m, (nn.BatchNorm2d, nn.LayerNorm, nn.GroupNorm)):
            for np_, _ in m.named_parameters():
                if np_ in ['weight', 'bias']:
                    names.append(f'{nm}.{np_}')
    return names


def authors_norm_params(model):
    """``collect_params`` of SAR's ``tent.py`` and ``eata.py``: the affine
    parameters of every BN/GN/LN, in module order."""
    return [f'{nm}.{np_}' for nm, m in model.named_modules()
            if isinstance(m, (nn.BatchNorm2d, nn.GroupNorm, nn.LayerNorm))
            for np_, _ in m.named_parameters() if np_ in ['weight', 'bias']]


def authors_lr(model, batch_size):
    """The learning rate of SAR's / DeYO's ``main.py`` for ImageNet-C."""
    if model == 'vit-b16':
        return 0.001 / 64 * batch_size
    return 0.00025 / 64 * batch_size * 2 if batch_size < 32 else 0.00025


@pytest.mark.parametrize('model', ['resnet50-bn', 'resnet50-gn', 'vit-b16'])
@pytest.mark.parametrize('method', ['sar', 'deyo', 'tent', 'eata'])
def test_adapted_parameters_are_the_authors(model, method):
    from mmseg_stag.core import HeadProbe, TaskAdapter, build_method
    net = source(model)
    # the configs' test-batch BN statistics
    ours = build_method(dict(type=method, bn_batch_stats=True))
    classifier = 'head' if model == 'vit-b16' else 'fc'
    ours.configure(net, TaskAdapter(HeadProbe(classifier)))
    if method in ('tent', 'eata'):
        expected = authors_norm_params(source(model))
        assert [n for n, _ in ours.params] == expected
        return
    expected = authors_collect_params(source(model))
    assert [n for n, _ in ours.params] == expected
    assert expected  # the selection is not empty
    if model == 'vit-b16':
        assert not any(n.startswith(('blocks.9.', 'blocks.10.',
                                     'blocks.11.', 'norm.')) for n in expected)
    else:
        assert not any(n.startswith('layer4.') for n in expected)


#: every ImageNet-C config of a method with a learning rate
LR_CONFIGS = sorted(
    p for p in glob.glob(osp.join(REPO, 'configs/cls/imagenet-c/*.py'))
    if not p.endswith(('_source.py', '_bn-adapt.py')))


@pytest.mark.parametrize('path', LR_CONFIGS, ids=osp.basename)
def test_config_learning_rates_are_the_authors(path):
    scenario, model = osp.basename(path).split('_')[1:3]
    cfg = Config.fromfile(path)
    batch_size = dict(bs1=1).get(scenario, 64)
    assert cfg.test_dataloader.batch_size == batch_size
    optimizer = cfg.test_cfg.method.optimizer
    assert (optimizer.type, optimizer.momentum) == ('SGD', 0.9)
    assert optimizer.lr == pytest.approx(authors_lr(model, batch_size))


def test_every_paper_row_has_a_config():
    """The SAR/DeYO rows of batch 64 and 1 (the ResNet-50-BN has no
    batch-1 row) are among the configs checked above."""
    names = {osp.basename(p) for p in LR_CONFIGS}
    for model in ('resnet50-bn', 'resnet50-gn', 'vit-b16'):
        for scenario in ('mild', 'bs1'):
            if (model, scenario) == ('resnet50-bn', 'bs1'):
                continue
            for method in ('sar', 'deyo'):
                assert f'imagenet-c_{scenario}_{model}_{method}.py' in names


@pytest.mark.parametrize('model', ['resnet50-bn', 'resnet50-gn', 'vit-b16'])
def test_normalisation_is_the_authors(model):
    """SAR's ``dataset/selectedRotateImageFolder.py`` normalises every
    ImageNet-C model, the ViT included, with ImageNet's mean and std."""
    cfg = Config.fromfile(osp.join(REPO, 'configs/cls/_base_/models',
                                   f'{model}.py'))
    assert tuple(cfg.model.data_preprocessor.mean) == (0.485, 0.456, 0.406)
    assert tuple(cfg.model.data_preprocessor.std) == (0.229, 0.224, 0.225)


def authors_fisher(net, batches):
    """The Fisher loop of SAR's ``main.py`` (method ``eata``): the model's
    argmax as the target, cross-entropy, ``grad ** 2`` summed over the
    batches and divided by their number at the last one."""
    import torch.nn.functional as F
    fishers = {}
    for iter_, images in enumerate(batches, start=1):
        outputs = net(images)
        F.cross_entropy(outputs, outputs.max(1)[1]).backward()
        for name, param in net.named_parameters():
            if param.grad is not None:
                fisher = param.grad.detach().clone() ** 2
                if iter_ > 1:
                    fisher = fisher + fishers[name][0]
                if iter_ == len(batches):
                    fisher = fisher / iter_
                fishers[name] = [fisher, param.detach().clone()]
                param.grad = None
    return fishers


@pytest.mark.parametrize('model,size', [('resnet50-bn', 64),
                                        ('vit-b16', 224)])
def test_eata_fisher_is_the_authors(model, size):
    import torch

    from mmseg_stag.core import (Batch, HeadProbe, TaskAdapter, build_method,
                                 use_batch_statistics)
    torch.manual_seed(1)
    batches = [torch.rand(2, 3, size, size, dtype=torch.float64)
               for _ in range(2)]
    theirs = source(model).double()
    use_batch_statistics(theirs)  # their configure_model
    theirs.requires_grad_(False)
    for name in authors_norm_params(theirs):
        theirs.get_parameter(name).requires_grad_(True)
    expected = authors_fisher(theirs.train(), batches)
    net = source(model).double()
    use_batch_statistics(net)
    ours = build_method(dict(type='eata'))
    classifier = 'head' if model == 'vit-b16' else 'fc'
    ours.configure(net, TaskAdapter(HeadProbe(classifier)))
    ours.fit_source([Batch(x) for x in batches])
    assert list(ours.fishers) == list(expected) == authors_norm_params(net)
    for name, (fisher, theta0) in ours.fishers.items():
        torch.testing.assert_close(fisher, expected[name][0], rtol=1e-9,
                                   atol=0)
        torch.testing.assert_close(theta0, expected[name][1], rtol=0, atol=0)
