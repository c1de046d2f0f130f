"""The paper's real classifiers with random weights, saved in the formats
users have and loaded through the project's configs and loader: torchvision
ResNet-50 (``.pth`` state dict), timm ResNet-50-GN and ViT-B/16 (``.pth``
and ``.safetensors``), the RobustBench WRN-28-10 / WRN-40-2 (``{'state_dict':
{'module.' + key}}``); the classifier each config names; bad files."""
import os.path as osp

import pytest
import torch
from mmengine.config import Config

from conftest import need

torchvision = need('torchvision')
timm = need('timm')
safetensors_torch = need('safetensors.torch')

REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
MODELS = osp.join(REPO, 'configs', 'cls', '_base_', 'models')


def build(base):
    """The ``OnlineClassifier`` of a model base config, in eval mode."""
    import mmseg_stag  # noqa: F401  (registries)
    from mmseg_stag.registry import MODELS as REGISTRY
    cfg = Config.fromfile(osp.join(MODELS, f'{base}.py'))
    return REGISTRY.build(dict(cfg.model, _scope_='mmseg_stag')).eval()


def source(base):
    """The library's own network with random (seeded) weights."""
    torch.manual_seed(0)
    if base == 'resnet50-bn':
        return torchvision.models.resnet50(weights=None)
    if base == 'resnet50-gn':
        return timm.create_model('resnet50_gn', pretrained=False)
    if base == 'vit-b16':
        return timm.create_model('vit_base_patch16_224', pretrained=False)
    from mmseg_stag.classification import wrn28_10_standard, wrn40_2_augmix
    return (wrn28_10_standard if base == 'wrn-28-10' else wrn40_2_augmix)()


def save(net, path):
    state = net.state_dict()
    if path.endswith('.safetensors'):
        safetensors_torch.save_file(
            {k: v.contiguous() for k, v in state.items()}, path)
    elif path.endswith('.pt'):  # RobustBench: DataParallel keys, a dict
        torch.save({'state_dict': {f'module.{k}': v
                                   for k, v in state.items()}}, path)
    else:
        torch.save(state, path)


CASES = [('resnet50-bn', 'resnet50-19c8e357.pth', 'fc', 224),
         ('resnet50-gn', 'resnet50_gn_a1h2-8fe6c4d0.pth', 'fc', 224),
         ('resnet50-gn', 'resnet50_gn.safetensors', 'fc', 224),
         ('vit-b16', 'vit_base_patch16_224.safetensors', 'head', 224),
         ('vit-b16', 'vit_base_patch16_224.pth', 'head', 224),
         ('wrn-28-10', 'Standard.pt', 'fc', 32),
         ('wrn-40-2', 'Hendrycks2020AugMix_WRN.pt', 'fc', 32)]


@pytest.mark.parametrize('base,name,classifier,size', CASES)
def test_real_model_loads_its_file(tmp_path, base, name, classifier, size):
    net = source(base).eval()
    path = str(tmp_path / name)
    save(net, path)
    model = build(base)
    model.load_weights(path)
    assert model.classifier == classifier
    assert isinstance(dict(model.network.named_modules())[classifier],
                      torch.nn.Linear)
    x = torch.rand(2, 3, size, size)
    with torch.no_grad():
        torch.testing.assert_close(model.network(x), net(x))


def test_bad_files_are_named(tmp_path):
    from mmseg_stag.classification import build_cls_model, load_weights
    with pytest.raises(ValueError, match="no model 'vit_base_patch99_224'"):
        build_cls_model(dict(type='TimmModel',
                             model_name='vit_base_patch99_224'))
    resnet = build('resnet50-gn')
    npz = tmp_path / 'resnet.npz'
    npz.write_bytes(b'')
    with pytest.raises(ValueError, match=r'resnet\.npz: \.npz weights need '
                       'a timm model with load_pretrained'):
        load_weights(resnet.network, str(npz))
    small = timm.create_model('resnet50_gn', pretrained=False,
                              num_classes=10)
    path = str(tmp_path / 'ten_classes.pth')
    torch.save(small.state_dict(), path)
    with pytest.raises(ValueError,
                       match=r'(?s)ten_classes\.pth does not match .*'
                       r'fc\.weight: file \(10, 2048\) vs model '
                       r'\(1000, 2048\)'):
        resnet.load_weights(path)
