"""The paper's real classifiers with random weights, saved in the formats
users have and loaded through the project's configs and loader: torchvision
ResNet-50 (``.pth`` state dict), timm ResNet-50-GN and ViT-B/16 (``.pth``
and ``.safetensors``; the ViT's original ``.npz`` too), the RobustBench
WRN-28-10 / WRN-40-2 (``{'state_dict': {'module.' + key}}``); the
classifier each config names; bad files."""
import os.path as osp

import numpy as np
import pytest
import torch
from mmengine.config import Config
from real_model_helpers import REPO, need, original_vit_npz, save, source

torchvision = need('torchvision')
timm = need('timm')
safetensors_torch = need('safetensors.torch')

MODELS = osp.join(REPO, 'configs', 'cls', '_base_', 'models')


def build(base):
    """The ``OnlineClassifier`` of a model base config, in eval mode."""
    import mmseg_stag  # noqa: F401  (registries)
    from mmseg_stag.registry import MODELS as REGISTRY
    cfg = Config.fromfile(osp.join(MODELS, f'{base}.py'))
    return REGISTRY.build(dict(cfg.model, _scope_='mmseg_stag')).eval()


CASES = [('resnet50-bn', 'resnet50-19c8e357.pth', 'fc', 224),
         ('resnet50-gn', 'resnet50_gn_a1h2-8fe6c4d0.pth', 'fc', 224),
         ('resnet50-gn', 'resnet50_gn.safetensors', 'fc', 224),
         ('vit-b16', 'vit_base_patch16_224.safetensors', 'head', 224),
         ('vit-b16', 'vit_base_patch16_224.pth', 'head', 224),
         ('vit-b16', 'ViT-B_16-i21k-ft-in1k.npz', 'head', 224),
         ('wrn-28-10', 'Standard.pt', 'fc', 32),
         ('wrn-40-2', 'Hendrycks2020AugMix_WRN.pt', 'fc', 32)]


@pytest.mark.parametrize('base,name,head_layer,size', CASES)
def test_real_model_loads_its_file(tmp_path, base, name, head_layer, size):
    net = source(base).eval()
    path = str(tmp_path / name)
    save(net, path)
    model = build(base)
    model.load_weights(path)
    # the classifier the loop probes by default: the last nn.Linear
    from mmseg_stag.core import HeadProbe
    assert HeadProbe().find(model.network)[0] == head_layer
    assert isinstance(dict(model.network.named_modules())[head_layer],
                      torch.nn.Linear)
    x = torch.rand(2, 3, size, size)
    with torch.no_grad():
        torch.testing.assert_close(model.network(x), net(x))


def test_bad_files_are_named(tmp_path):
    from mmseg_stag.classification import CLS_MODELS, load_weights
    with pytest.raises(ValueError, match="no model 'vit_base_patch99_224'"):
        CLS_MODELS.build(dict(type='TimmModel',
                              model_name='vit_base_patch99_224'))
    resnet = build('resnet50-gn')
    npz = str(tmp_path / 'resnet.npz')
    np.savez(npz, x=np.zeros(1))
    with pytest.raises(ValueError, match=r'resnet\.npz: a \.npz holds the '
                       r'original \(JAX\) ViT weights, but the model is a '
                       'ResNet'):
        load_weights(resnet.network, npz)
    small = timm.create_model('resnet50_gn', pretrained=False,
                              num_classes=10)
    path = str(tmp_path / 'ten_classes.pth')
    torch.save(small.state_dict(), path)
    with pytest.raises(ValueError,
                       match=r'(?s)ten_classes\.pth does not match .*'
                       r'fc\.weight: file \(10, 2048\) vs model '
                       r'\(1000, 2048\)'):
        resnet.load_weights(path)


def test_bad_vit_npz_files_are_named(tmp_path):
    """What timm's .npz loader would adapt silently is refused: a head of
    another size (kept random), another patch size (resampled); a file
    that is no ViT .npz, or lacks a tensor, is named."""
    from mmseg_stag.classification import load_weights
    vit = build('vit-b16').network
    tiny = timm.create_model('vit_base_patch16_224', pretrained=False,
                             num_classes=10, depth=2)
    path = str(tmp_path / 'ten_classes.npz')
    save(tiny, path)
    with pytest.raises(ValueError, match=r'(?s)ten_classes\.npz does not '
                       r'match VisionTransformer:.*head: file \(10,\) vs '
                       r'model \(1000,\).*blocks: file 2 vs model 12'):
        load_weights(vit, path)
    path = str(tmp_path / 'patch32.npz')
    save(timm.create_model('vit_base_patch32_224', pretrained=False,
                           depth=1), path)
    with pytest.raises(ValueError, match=r'(?s)patch32\.npz .*'
                       r'patch_embedding: file \(32, 32, 3, 768\) vs '
                       r'model \(16, 16, 3, 768\)'):
        load_weights(vit, path)
    arrays = original_vit_npz(source('vit-b16'))
    del arrays['Transformer/encoderblock_3/LayerNorm_2/scale']
    path = str(tmp_path / 'incomplete.npz')
    np.savez(path, **arrays)
    with pytest.raises(ValueError, match=r'incomplete\.npz does not match '
                       r'VisionTransformer: KeyError: .*encoderblock_3/'
                       'LayerNorm_2/scale'):
        load_weights(vit, path)
    path = tmp_path / 'not_an_archive.npz'
    path.write_bytes(b'not a zip')
    with pytest.raises(ValueError, match=r'not_an_archive\.npz: not a '
                       r'readable \.npz archive'):
        load_weights(vit, str(path))
