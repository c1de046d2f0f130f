"""Helpers shared by the real classifiers' tests (``tests/real_models``):
the import guard for torchvision and timm, the paper's networks with random
weights and their files in the formats users have.

The real classifiers' tests run where torchvision and timm import (the
``.venv-real`` environment that ``make test`` builds and uses). Elsewhere
they are skipped with the reason, unless ``MMSEG_STAG_REAL_MODELS=required``
(set by ``make test``): then a missing library is a failure. Each test
module calls :func:`need` for what it imports, before anything else here.

A module of its own (``tests`` is on ``pythonpath``), not a test module or
a ``conftest.py``: test modules import neither (with several
``conftest.py`` files in the tree, the module named ``conftest`` is
whichever pytest loaded last)."""
import importlib
import os
import os.path as osp

import numpy as np
import pytest
import torch

REPO = osp.dirname(osp.dirname(osp.abspath(__file__)))
REQUIRED = os.environ.get('MMSEG_STAG_REAL_MODELS') == 'required'


def need(module: str):
    """Import ``module`` or skip the calling test module (fail when the
    real-model environment is required)."""
    try:
        return importlib.import_module(module)
    except Exception as err:  # torchvision fails with RuntimeError too
        if REQUIRED:
            raise
        pytest.skip(f'{module} cannot be imported here ({type(err).__name__}'
                    f': {err}); the real-model tests run in .venv-real '
                    '(tools/install_real_models_env.sh, make test)',
                    allow_module_level=True)


def source(base):
    """The library's own network with random (seeded) weights (call
    ``need('torchvision')`` and ``need('timm')`` first)."""
    import timm
    import torchvision
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
    """``net``'s weights in the file format ``path``'s suffix names:
    ``.npz`` (a timm ViT in the original JAX layout), ``.safetensors``,
    ``.pt`` (RobustBench: ``{'state_dict': {'module.' + key}}``), else a
    plain ``.pth`` state dict."""
    state = net.state_dict()
    if path.endswith('.npz'):
        np.savez(path, **original_vit_npz(net))
    elif path.endswith('.safetensors'):
        import safetensors.torch as safetensors_torch
        safetensors_torch.save_file(
            {k: v.contiguous() for k, v in state.items()}, path)
    elif path.endswith('.pt'):  # RobustBench: DataParallel keys, a dict
        torch.save({'state_dict': {f'module.{k}': v
                                   for k, v in state.items()}}, path)
    else:
        torch.save(state, path)
