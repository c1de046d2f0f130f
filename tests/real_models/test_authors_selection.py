"""Held-out check of the authors' per-model settings on the real networks:
the parameters SAR and DeYO adapt (a transcription of their
``collect_params``, the same function in both repositories: norm layers'
weight and bias, skipping ResNet ``layer4``, ViT ``blocks.9``-``blocks.11``
and the final ``norm``) equal, in order, the ones our methods select from
the configs' defaults; and the configs' learning rates equal their
``main.py`` rule (ResNets ``0.00025 * B / 64``, doubled below 32; ViT
``0.001 * B / 64``)."""
import os.path as osp

import pytest
import torch.nn as nn
from mmengine.config import Config

from conftest import need

torchvision = need('torchvision')
timm = need('timm')

from test_real_classifiers import REPO, source  # noqa: E402


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


def authors_lr(model, batch_size):
    """The learning rate of SAR's / DeYO's ``main.py`` for ImageNet-C."""
    if model == 'vit-b16':
        return 0.001 / 64 * batch_size
    return 0.00025 / 64 * batch_size * 2 if batch_size < 32 else 0.00025


@pytest.mark.parametrize('model', ['resnet50-bn', 'resnet50-gn', 'vit-b16'])
@pytest.mark.parametrize('method', ['sar', 'deyo'])
def test_adapted_parameters_are_the_authors(model, method):
    from mmseg_stag.core import build_method, use_batch_statistics
    net = source(model)
    use_batch_statistics(net)  # the configs' bn_batch_stats
    ours = build_method(dict(type=method))
    classifier = net.head if model == 'vit-b16' else net.fc
    ours.configure(net, classifier)
    expected = authors_collect_params(source(model))
    assert [n for n, _ in ours.params] == expected
    assert expected  # the selection is not empty
    if model == 'vit-b16':
        assert not any(n.startswith(('blocks.9.', 'blocks.10.',
                                     'blocks.11.', 'norm.')) for n in expected)
    else:
        assert not any(n.startswith('layer4.') for n in expected)


#: the paper's ImageNet-C SAR/DeYO rows at batch 64 and batch 1 (the
#: ResNet-50-BN has no batch-1 row)
LR_ROWS = [(model, scenario, batch, method)
           for model in ('resnet50-bn', 'resnet50-gn', 'vit-b16')
           for scenario, batch in (('mild', 64), ('bs1', 1))
           for method in ('sar', 'deyo')
           if (model, scenario) != ('resnet50-bn', 'bs1')]


@pytest.mark.parametrize('model,scenario,batch_size,method', LR_ROWS)
def test_config_learning_rates_are_the_authors(model, scenario, batch_size,
                                               method):
    path = osp.join(REPO, 'configs/cls/imagenet-c/imagenet-c_'
                    f'{scenario}_{model}_{method}.py')
    cfg = Config.fromfile(path)
    assert cfg.test_dataloader.batch_size == batch_size
    assert cfg.test_cfg.method.optimizer.lr == pytest.approx(
        authors_lr(model, batch_size))
