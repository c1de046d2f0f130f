"""Source models: the classifier the head probe finds in them, the
RobustBench WideResNets, strict weight loading and the optional extras."""
import sys
import types

import pytest
import torch

from mmseg_stag.classification import (CLS_MODELS, SmallCNN, SmallViT,
                                       load_weights, wrn28_10_standard,
                                       wrn40_2_augmix)
from mmseg_stag.core import HeadProbe


def test_probe_finds_the_classifier_of_the_cls_models():
    # the default (the last nn.Linear) is the classifier of every model the
    # harness builds; the generic probe is tested in tests/core
    assert HeadProbe().find(SmallViT())[0] == 'head'
    assert HeadProbe().find(wrn40_2_augmix())[0] == 'fc'
    assert HeadProbe().find(SmallCNN(width=4))[0] == 'fc'
    model = CLS_MODELS.build(dict(type='SmallCNN', width=4))
    assert HeadProbe('fc').find(model)[0] == 'fc'
    with pytest.raises(ValueError, match="no module 'head'"):
        HeadProbe('head').find(model)


# ------------------------------------------------------------ WideResNets
def test_wrn_parameter_names_and_sizes():
    wrn28 = wrn28_10_standard()
    sd = wrn28.state_dict()
    shapes = {
        'conv1.weight': (16, 3, 3, 3),
        'block1.layer.0.bn1.weight': (16, ),
        'block1.layer.0.conv1.weight': (160, 16, 3, 3),
        'block1.layer.0.convShortcut.weight': (160, 16, 1, 1),
        'block2.layer.0.convShortcut.weight': (320, 160, 1, 1),
        'block3.layer.3.conv2.weight': (640, 640, 3, 3),
        'block3.layer.3.bn2.running_var': (640, ),
        'bn1.weight': (640, ),
        'fc.weight': (10, 640),
        'fc.bias': (10, ),
    }
    for key, shape in shapes.items():
        assert tuple(sd[key].shape) == shape, key
    assert 'block1.layer.1.convShortcut.weight' not in sd
    n28 = sum(p.numel() for p in wrn28.parameters())
    assert abs(n28 - 36.5e6) < 0.05e6
    wrn40 = wrn40_2_augmix()
    sd40 = wrn40.state_dict()
    assert tuple(sd40['block1.layer.5.conv2.weight'].shape) == (32, 32, 3, 3)
    assert tuple(sd40['fc.weight'].shape) == (100, 128)
    assert 'mu' not in sd40 and 'sigma' not in sd40
    n40 = sum(p.numel() for p in wrn40.parameters())
    assert abs(n40 - 2.2e6) < 0.1e6
    assert wrn28(torch.rand(2, 3, 32, 32)).shape == (2, 10)


def test_wrn_loads_robustbench_style_files(tmp_path):
    src = wrn40_2_augmix()
    # RobustBench files: DataParallel 'module.' prefixes, no mu/sigma
    state = {f'module.{k}': v for k, v in src.state_dict().items()}
    path = str(tmp_path / 'Hendrycks2020AugMix_WRN.pt')
    torch.save({'state_dict': state, 'epoch': 100}, path)
    model = CLS_MODELS.build(dict(type='WRN40_2_AugMix'))
    load_weights(model, path)
    model.eval()
    x = torch.rand(2, 3, 32, 32)
    torch.testing.assert_close(model(x), src.eval()(x))
    # a file that does hold mu/sigma loads too
    extra = dict(src.state_dict(), mu=torch.zeros(1, 3, 1, 1),
                 sigma=torch.ones(1, 3, 1, 1))
    torch.save(extra, str(tmp_path / 'with_mu.pt'))
    load_weights(wrn40_2_augmix(), str(tmp_path / 'with_mu.pt'))


def test_weight_loading_errors(tmp_path):
    model = SmallCNN(width=4)
    bad = dict(model.state_dict())
    bad.pop('fc.bias')
    bad['extra.weight'] = torch.zeros(1)
    torch.save(bad, str(tmp_path / 'bad.pth'))
    with pytest.raises(ValueError, match=r'missing keys \(1\): fc.bias'):
        load_weights(model, str(tmp_path / 'bad.pth'))
    with pytest.raises(FileNotFoundError, match='nope.pth'):
        load_weights(model, str(tmp_path / 'nope.pth'))
    torch.save({'state_dict': model.state_dict(), 'meta': {'x': object()}},
               str(tmp_path / 'pickled.pth'))
    with pytest.raises(RuntimeError, match='--trust-pickle'):
        load_weights(model, str(tmp_path / 'pickled.pth'))
    load_weights(model, str(tmp_path / 'pickled.pth'),
                 allow_unsafe_pickle=True)


def test_optional_extras(monkeypatch):
    monkeypatch.setitem(sys.modules, 'torchvision', None)
    monkeypatch.setitem(sys.modules, 'torchvision.models', None)
    with pytest.raises(ImportError, match=r'pip install -e \.\[cls\]'):
        CLS_MODELS.build(dict(type='TorchvisionResNet50'))
    fake = types.ModuleType('timm')
    fake.create_model = lambda name, pretrained, num_classes: SmallViT(
        num_classes=num_classes)
    fake.is_model = lambda name: name == 'vit_base_patch16_224'
    monkeypatch.setitem(sys.modules, 'timm', fake)
    model = CLS_MODELS.build(dict(type='TimmModel',
                                  model_name='vit_base_patch16_224',
                                  num_classes=7))
    assert HeadProbe().find(model)[0] == 'head'
    assert model.head.out_features == 7
