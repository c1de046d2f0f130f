"""The paper's real classifiers with random weights, saved in the formats
users have and loaded through the project's configs and loader: torchvision
ResNet-50 (``.pth`` state dict), timm ResNet-50-GN and ViT-B/16 (``.pth``
and ``.safetensors``; the ViT's original ``.npz`` too), the RobustBench WRN-28-10 / WRN-40-2 (``{'state_dict':
{'module.' + key}}``); the classifier each config names; bad files."""
import os.path as osp

import numpy as np
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


def original_vit_npz(vit) -> dict:
    """A timm ViT's tensors in the layout of the original (JAX) ``.npz``
    files, e.g. ``ViT-B_16.npz`` / the AugReg files: the inverse of timm's
    ``vision_transformer._load_weights`` (HWIO convolutions, ``(in, out)``
    dense kernels, per-head attention kernels)."""
    state = {k: v.detach().numpy() for k, v in vit.state_dict().items()}
    heads = vit.blocks[0].attn.num_heads
    out = {'embedding/kernel': state['patch_embed.proj.weight'].transpose(
               2, 3, 1, 0),
           'embedding/bias': state['patch_embed.proj.bias'],
           'cls': state['cls_token'],
           'Transformer/posembed_input/pos_embedding': state['pos_embed'],
           'Transformer/encoder_norm/scale': state['norm.weight'],
           'Transformer/encoder_norm/bias': state['norm.bias'],
           'head/kernel': state['head.weight'].T,
           'head/bias': state['head.bias']}
    for i in range(len(vit.blocks)):
        b, o = f'blocks.{i}.', f'Transformer/encoderblock_{i}/'
        dim = state[b + 'norm1.weight'].shape[0]
        for name, w, bias in zip(
                ('query', 'key', 'value'),
                state[b + 'attn.qkv.weight'].reshape(3, dim, dim),
                state[b + 'attn.qkv.bias'].reshape(3, dim)):
            mha = f'{o}MultiHeadDotProductAttention_1/{name}/'
            out[mha + 'kernel'] = w.T.reshape(dim, heads, -1)
            out[mha + 'bias'] = bias.reshape(heads, -1)
        mha = f'{o}MultiHeadDotProductAttention_1/out/'
        out[mha + 'kernel'] = state[b + 'attn.proj.weight'].reshape(
            dim, heads, -1).transpose(1, 2, 0)
        out[mha + 'bias'] = state[b + 'attn.proj.bias']
        for ours, theirs in (('norm1', 'LayerNorm_0'),
                             ('norm2', 'LayerNorm_2')):
            out[f'{o}{theirs}/scale'] = state[f'{b}{ours}.weight']
            out[f'{o}{theirs}/bias'] = state[f'{b}{ours}.bias']
        for r in range(2):
            dense = f'{o}MlpBlock_3/Dense_{r}/'
            out[dense + 'kernel'] = state[f'{b}mlp.fc{r + 1}.weight'].T
            out[dense + 'bias'] = state[f'{b}mlp.fc{r + 1}.bias']
    return out


def save(net, path):
    state = net.state_dict()
    if path.endswith('.npz'):
        np.savez(path, **original_vit_npz(net))
    elif path.endswith('.safetensors'):
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
    from mmseg_stag.classification import build_cls_model, load_weights
    with pytest.raises(ValueError, match="no model 'vit_base_patch99_224'"):
        build_cls_model(dict(type='TimmModel',
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
