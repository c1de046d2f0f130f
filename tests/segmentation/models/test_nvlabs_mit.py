"""``NVMixVisionTransformer``: MMSeg's MiT with NVlabs' LayerNorm eps
values, against the transcription of NVlabs' MiT
(``tests/reference/nvlabs_mit_reference.py``) through the converter."""
import glob
import os.path as osp
import re
from collections import OrderedDict

import pytest
import torch
import torch.nn as nn
from mmengine.registry import init_default_scope
from mmseg.models.backbones import MixVisionTransformer
from mmseg.registry import MODELS
from reference import nvlabs_mit_reference as nvref
from seg_helpers import REPO, build_from_config, mit_backbone, tiny_options
from tool_runs import tool_module

import mmseg_stag  # noqa: F401  (registers the components)
from mmseg_stag.segmentation.models import NVMixVisionTransformer

# the mapping is the converter tool's (tools/convert_nvlabs_segformer.py)
_TOOL = tool_module('convert_nvlabs_segformer')
convert_nvlabs_segformer = _TOOL.convert_nvlabs_segformer

# tiny NVlabs MiT: widths 16/32/40/64, head width 8 (MMSeg's MiT has
# width = embed_dims * num_heads), one block per stage
WIDTHS, HEADS, SR = [16, 32, 40, 64], [2, 4, 5, 8], [8, 4, 2, 1]
MIT = dict(embed_dims=8, num_heads=HEADS, num_layers=[1, 1, 1, 1],
           sr_ratios=SR)
# the fast presets (``…_bf16.py``, ``…_bf16-graph.py``):
# tests/segmentation/test_presets.py
NVLABS_CONFIGS = sorted(
    p for p in glob.glob(osp.join(REPO, 'configs', 'stag_acdc', '*nvlabs*.py'))
    if not p.endswith(('_bf16.py', '_bf16-graph.py')))


def layer_norm_eps(model):
    """``{module name: eps}`` of every LayerNorm of ``model``."""
    return {name: m.eps for name, m in model.named_modules()
            if isinstance(m, nn.LayerNorm)}


def build_reference(seed=0):
    """The transcribed NVlabs MiT, float64, with random weights (the norms'
    affine parameters too, so that none is the identity)."""
    torch.manual_seed(seed)
    model = nvref.MixVisionTransformer(
        embed_dims=WIDTHS, num_heads=HEADS, mlp_ratios=[4] * 4,
        depths=[1] * 4, sr_ratios=SR)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.LayerNorm):
                m.weight.normal_(1.0, 0.1)
                m.bias.normal_(0.0, 0.1)
    return model.double().eval()


def build_ours(type_='NVMixVisionTransformer', **kwargs):
    init_default_scope('mmseg')
    cfg = mit_backbone(type=type_, **MIT)
    cfg.update(kwargs)
    return MODELS.build(cfg).double().eval()


def convert_nvlabs_mit(state_dict):
    """An NVlabs MiT state dict (no ``backbone.`` prefix) on the keys of
    MMSeg's ``MixVisionTransformer``, in order: through the checkpoint
    converter, under ``backbone.`` beside a stand-in classifier (which it
    requires) that is dropped again."""
    whole = OrderedDict((f'backbone.{k}', v) for k, v in state_dict.items())
    whole['decode_head.linear_pred.weight'] = torch.zeros(1, 1, 1, 1)
    return OrderedDict(
        (k[len('backbone.'):], v)
        for k, v in convert_nvlabs_segformer(whole).items()
        if k.startswith('backbone.'))


def load_converted(model, reference):
    result = model.load_state_dict(
        convert_nvlabs_mit(reference.state_dict()), strict=True)
    assert not result.missing_keys and not result.unexpected_keys
    return model


def max_diffs(outs, refs):
    assert [o.shape for o in outs] == [r.shape for r in refs]
    return [(o - r).abs().max().item() for o, r in zip(outs, refs)]


def test_eps_of_every_norm_matches_nvlabs():
    ours = build_ours()
    assert isinstance(ours, MixVisionTransformer)
    eps = layer_norm_eps(ours)
    expected = {}
    for i in range(4):
        expected[f'layers.{i}.0.norm'] = 1e-5  # patch embedding
        expected[f'layers.{i}.1.0.norm1'] = 1e-6
        expected[f'layers.{i}.1.0.norm2'] = 1e-6
        if SR[i] > 1:
            expected[f'layers.{i}.1.0.attn.norm'] = 1e-5  # spatial reduction
        expected[f'layers.{i}.2'] = 1e-6  # stage norm
    assert eps == expected
    # the same, name by name, as the transcription (NVlabs' names mapped by
    # the converter)
    ref_eps = layer_norm_eps(build_reference())
    mapped = convert_nvlabs_mit(
        {f'{name}.weight': torch.zeros(1) for name in ref_eps})
    # one key in, one key out, in order
    assert {key[:-len('.weight')]: e
            for key, e in zip(mapped, ref_eps.values())} == eps
    # MMSeg's MiT: 1e-6 everywhere
    assert set(layer_norm_eps(build_ours('MixVisionTransformer')).values()) \
        == {1e-6}


def test_converted_backbone_computes_nvlabs_mit():
    """All four stages equal NVlabs' MiT in float64; MMSeg's plain MiT with
    the same weights does not, nor does ours with either eps set to 1e-6
    (each of the two matters)."""
    reference = build_reference()
    ours = load_converted(build_ours(), reference)
    wrong = [load_converted(build_ours('MixVisionTransformer'), reference),
             load_converted(build_ours(patch_embed_norm_eps=1e-6), reference),
             load_converted(build_ours(sr_norm_eps=1e-6), reference)]
    gen = torch.Generator().manual_seed(1)
    # a low-contrast image: small-variance patch embeddings, where the
    # LayerNorm eps weighs more (max differences ~1e-3 from MMSeg's MiT
    # here, ~1e-5 with unit-variance input)
    x = 0.05 * torch.randn(2, 3, 64, 96, generator=gen, dtype=torch.float64)
    with torch.no_grad():
        refs = reference(x)
        outs = ours(x)
        wrong_outs = [model(x) for model in wrong]
    assert [tuple(r.shape[1:]) for r in refs] == [
        (16, 16, 24), (32, 8, 12), (40, 4, 6), (64, 2, 3)]
    for out, ref in zip(outs, refs):
        torch.testing.assert_close(out, ref, rtol=0, atol=1e-12)
    for outs in wrong_outs:
        assert min(max_diffs(outs, refs)) > 1e-6


def test_eps_options():
    """With 1e-6 for both it is MMSeg's MiT exactly: the subclass changes
    nothing but the two eps values."""
    reference = build_reference()
    same = load_converted(
        build_ours(patch_embed_norm_eps=1e-6, sr_norm_eps=1e-6), reference)
    plain = load_converted(build_ours('MixVisionTransformer'), reference)
    x = torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(2),
                    dtype=torch.float64)
    with torch.no_grad():
        assert max_diffs(same(x), plain(x)) == [0.0] * 4
    custom = build_ours(patch_embed_norm_eps=1e-3, sr_norm_eps=1e-4,
                        norm_cfg=dict(type='LN', eps=1e-7))
    assert (custom.patch_embed_norm_eps, custom.sr_norm_eps) == (1e-3, 1e-4)
    eps = layer_norm_eps(custom)
    assert eps['layers.0.0.norm'] == 1e-3
    assert eps['layers.0.1.0.attn.norm'] == 1e-4
    assert eps['layers.0.1.0.norm1'] == eps['layers.3.2'] == 1e-7
    with pytest.raises(TypeError, match='LayerNorm'):
        build_ours(norm_cfg=dict(type='BN'))


@pytest.mark.parametrize('path', NVLABS_CONFIGS, ids=osp.basename)
def test_nvlabs_configs_build_the_nvlabs_backbone(path, tiny_acdc):
    assert len(NVLABS_CONFIGS) == 15  # every method, +STAG
    model, cfg = build_from_config(osp.relpath(path, REPO),
                                   tiny_options(tiny_acdc, head='nvlabs'))
    assert cfg.model.backbone.type == 'NVMixVisionTransformer'
    assert type(model.backbone) is NVMixVisionTransformer
    eps = layer_norm_eps(model.backbone)
    nvlabs_default = re.compile(r'layers\.\d\.(0\.norm|1\.\d+\.attn\.norm)')
    assert {e for n, e in eps.items() if nvlabs_default.fullmatch(n)} == \
        {1e-5}
    assert {e for n, e in eps.items()
            if not nvlabs_default.fullmatch(n)} == {1e-6}
