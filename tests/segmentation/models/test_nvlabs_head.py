"""``NVSegformerHead`` (NVlabs' SegFormer head) and the NVlabs checkpoint
converter (``tools/convert_nvlabs_segformer.py``, loaded by its path)."""
import copy
import os.path as osp
import sys

import pytest
import tool_runs
import torch
import torch.nn as nn
import torch.nn.functional as F
from mmengine.registry import init_default_scope
from mmseg.models.segmentors import EncoderDecoder
from mmseg.registry import MODELS
from reference import nvlabs_mit_reference as nvref
from seg_helpers import (NVLABS_SEG_CFG, REPO, build_from_config,
                         build_segmentor, mit_backbone, tiny_options)
from tool_runs import tool_module

import mmseg_stag  # noqa: F401  (registers the components)
from mmseg_stag.segmentation.models import NVSegformerHead


def load_tool():
    """The converter, ``tools/convert_nvlabs_segformer.py``, as a fresh
    module: its mapping and its command line."""
    return tool_module('convert_nvlabs_segformer')


_TOOL = load_tool()
convert_nvlabs_checkpoint = _TOOL.convert_nvlabs_checkpoint
convert_nvlabs_segformer = _TOOL.convert_nvlabs_segformer

NUM_CLASSES = 5
EMBED = 12  # embedding_dim (768 for B5)
BN = dict(type='BN', requires_grad=True)
# tiny MiT: stage widths embed_dims * num_heads = [8, 16, 16, 32]
MIT = dict(embed_dims=8, num_layers=[1, 2, 1, 1], num_heads=[1, 2, 2, 4],
           patch_sizes=[7, 3, 3, 3], sr_ratios=[8, 4, 2, 1], mlp_ratio=4)
WIDTHS = [MIT['embed_dims'] * h for h in MIT['num_heads']]


def head_cfg(**kwargs):
    cfg = dict(type='NVSegformerHead', embedding_dim=EMBED,
               in_channels=WIDTHS, in_index=[0, 1, 2, 3], dropout_ratio=0.1,
               num_classes=NUM_CLASSES, norm_cfg=BN, align_corners=False)
    cfg.update(kwargs)
    return cfg


def build_head(**kwargs):
    init_default_scope('mmseg')
    torch.manual_seed(0)
    return MODELS.build(head_cfg(**kwargs))


def build_nvlabs_segmentor():
    """MMSeg's plain EncoderDecoder: this file's MiT (with NVlabs' eps) +
    NVSegformerHead."""
    model = build_segmentor(head_cfg(), backbone=mit_backbone(
        type='NVMixVisionTransformer', **MIT))
    assert type(model) is EncoderDecoder
    return model


# -------------------------------------------------------------------- head
def test_head_parameters_mirror_nvlabs():
    head = build_head()
    names = {k: tuple(v.shape) for k, v in head.state_dict().items()}
    expected = {}
    for i, width in enumerate(WIDTHS, start=1):
        expected[f'linear_c{i}.proj.weight'] = (EMBED, width)
        expected[f'linear_c{i}.proj.bias'] = (EMBED, )
    expected['linear_fuse.conv.weight'] = (EMBED, 4 * EMBED, 1, 1)
    for p in ('weight', 'bias', 'running_mean', 'running_var'):
        expected[f'linear_fuse.bn.{p}'] = (EMBED, )
    expected['linear_fuse.bn.num_batches_tracked'] = ()
    expected['conv_seg.weight'] = (NUM_CLASSES, EMBED, 1, 1)
    expected['conv_seg.bias'] = (NUM_CLASSES, )
    assert names == expected
    assert isinstance(head, NVSegformerHead)
    assert head.channels == head.embedding_dim == EMBED
    assert isinstance(head.linear_c1.proj, nn.Linear)
    assert [type(m).__name__ for m in head.linear_c1.children()] == ['Linear']
    assert isinstance(head.linear_fuse.activate, nn.ReLU)
    assert head.input_transform == 'multiple_select'


def nvlabs_head_reference(head, levels):
    """NVlabs' SegFormerHead.forward written out with functional ops."""
    c1 = levels[0]
    n = c1.shape[0]
    embedded = {}
    for i, x in enumerate(levels, start=1):
        proj = getattr(head, f'linear_c{i}').proj
        tokens = F.linear(x.flatten(2).transpose(1, 2), proj.weight,
                          proj.bias)
        e = tokens.permute(0, 2, 1).reshape(n, -1, *x.shape[2:])
        if i > 1:
            e = F.interpolate(e, size=c1.shape[2:], mode='bilinear',
                              align_corners=False)
        embedded[i] = e
    x = torch.cat([embedded[4], embedded[3], embedded[2], embedded[1]], 1)
    bn = head.linear_fuse.bn
    x = F.conv2d(x, head.linear_fuse.conv.weight)
    x = F.batch_norm(x, bn.running_mean, bn.running_var, bn.weight, bn.bias,
                     False, 0.0, bn.eps)
    x = F.relu(x)  # dropout is the identity in eval mode
    return F.conv2d(x, head.conv_seg.weight, head.conv_seg.bias)


def test_head_forward_matches_nvlabs_order():
    head = build_head().eval()
    bn = head.linear_fuse.bn
    bn.running_mean.uniform_(-0.5, 0.5)
    bn.running_var.uniform_(0.5, 2.0)
    nn.init.normal_(bn.weight, 1.0, 0.2)
    nn.init.normal_(bn.bias, 0.0, 0.2)
    gen = torch.Generator().manual_seed(1)
    levels = [torch.randn(2, w, 12 // s, 20 // s, generator=gen)
              for w, s in zip(WIDTHS, (1, 2, 4, 8))]
    levels[3] = torch.randn(2, WIDTHS[3], 2, 3, generator=gen)
    with torch.no_grad():
        out = head(levels)
        ref = nvlabs_head_reference(head, levels)
    assert out.shape == (2, NUM_CLASSES, 12, 20)
    torch.testing.assert_close(out, ref)
    # the order matters: a [c1, c2, c3, c4] concatenation differs
    with torch.no_grad():
        w = head.linear_fuse.conv.weight
        head.linear_fuse.conv.weight.copy_(
            torch.cat(list(w.split(EMBED, dim=1))[::-1], dim=1))
        assert not torch.allclose(head(levels), ref)


def test_head_argument_checks():
    with pytest.raises(ValueError, match='channels .* must equal '
                       'embedding_dim'):
        build_head(channels=EMBED + 1)
    with pytest.raises(ValueError, match='4 input levels'):
        build_head(in_channels=WIDTHS[:3], in_index=[0, 1, 2])
    with pytest.raises(ValueError, match='multiple_select'):
        build_head(input_transform='resize_concat')
    assert build_head(channels=EMBED).channels == EMBED
    # NVlabs always normalises the fused feature
    assert isinstance(build_head(norm_cfg=None).linear_fuse.bn,
                      nn.BatchNorm2d)


# ---------------------------------------------------------------- converter
def nvlabs_state_dict(seed=0, with_unused_conv_seg=True, mit=MIT,
                      embed=EMBED, num_classes=NUM_CLASSES):
    """Random tensors with NVlabs' key layout and shapes for a MiT (``mit``:
    this file's by default; ``mit_b*`` names) + NVlabs ``SegFormerHead``,
    generated from the configuration, not from the MMSeg model."""
    gen = torch.Generator().manual_seed(seed)
    widths = [mit['embed_dims'] * h for h in mit['num_heads']]

    def rand(*shape):
        return torch.randn(*shape, generator=gen)

    nv = {}
    in_ch = 3
    for i, (width, depth, patch, sr) in enumerate(
            zip(widths, mit['num_layers'], mit['patch_sizes'],
                mit['sr_ratios']), start=1):
        pe = f'backbone.patch_embed{i}.'
        nv[pe + 'proj.weight'] = rand(width, in_ch, patch, patch)
        nv[pe + 'proj.bias'] = rand(width)
        nv[pe + 'norm.weight'], nv[pe + 'norm.bias'] = rand(width), rand(width)
        hidden = width * mit['mlp_ratio']
        for j in range(depth):
            b = f'backbone.block{i}.{j}.'
            for norm in ('norm1', 'norm2'):
                nv[f'{b}{norm}.weight'] = 1 + 0.1 * rand(width)
                nv[f'{b}{norm}.bias'] = 0.1 * rand(width)
            nv[b + 'attn.q.weight'] = rand(width, width) / width**0.5
            nv[b + 'attn.q.bias'] = 0.1 * rand(width)
            nv[b + 'attn.kv.weight'] = rand(2 * width, width) / width**0.5
            nv[b + 'attn.kv.bias'] = 0.1 * rand(2 * width)
            nv[b + 'attn.proj.weight'] = rand(width, width) / width**0.5
            nv[b + 'attn.proj.bias'] = 0.1 * rand(width)
            if sr > 1:
                nv[b + 'attn.sr.weight'] = rand(width, width, sr, sr) / (
                    sr * width**0.5)
                nv[b + 'attn.sr.bias'] = 0.1 * rand(width)
                nv[b + 'attn.norm.weight'] = 1 + 0.1 * rand(width)
                nv[b + 'attn.norm.bias'] = 0.1 * rand(width)
            nv[b + 'mlp.fc1.weight'] = rand(hidden, width) / width**0.5
            nv[b + 'mlp.fc1.bias'] = 0.1 * rand(hidden)
            nv[b + 'mlp.dwconv.dwconv.weight'] = rand(hidden, 1, 3, 3) / 3
            nv[b + 'mlp.dwconv.dwconv.bias'] = 0.1 * rand(hidden)
            nv[b + 'mlp.fc2.weight'] = rand(width, hidden) / hidden**0.5
            nv[b + 'mlp.fc2.bias'] = 0.1 * rand(width)
        nv[f'backbone.norm{i}.weight'] = 1 + 0.1 * rand(width)
        nv[f'backbone.norm{i}.bias'] = 0.1 * rand(width)
        in_ch = width
    for i, width in enumerate(widths, start=1):
        nv[f'decode_head.linear_c{i}.proj.weight'] = rand(embed, width)
        nv[f'decode_head.linear_c{i}.proj.bias'] = rand(embed)
    nv['decode_head.linear_fuse.conv.weight'] = rand(embed, 4 * embed, 1, 1)
    nv['decode_head.linear_fuse.bn.weight'] = rand(embed)
    nv['decode_head.linear_fuse.bn.bias'] = rand(embed)
    nv['decode_head.linear_fuse.bn.running_mean'] = rand(embed)
    nv['decode_head.linear_fuse.bn.running_var'] = rand(embed).abs() + 0.5
    nv['decode_head.linear_fuse.bn.num_batches_tracked'] = torch.tensor(
        160000)
    nv['decode_head.linear_pred.weight'] = rand(num_classes, embed, 1, 1)
    nv['decode_head.linear_pred.bias'] = rand(num_classes)
    if with_unused_conv_seg:  # NVlabs' BaseDecodeHead: channels=128
        nv['decode_head.conv_seg.weight'] = rand(num_classes, 128, 1, 1)
        nv['decode_head.conv_seg.bias'] = rand(num_classes)
    return nv


def test_converted_keys_load_strictly():
    nv = nvlabs_state_dict()
    converted = convert_nvlabs_segformer(nv)
    model = build_nvlabs_segmentor()  # MMSeg's plain EncoderDecoder
    result = model.load_state_dict(converted, strict=True)
    assert not result.missing_keys and not result.unexpected_keys
    assert set(converted) == set(model.state_dict())
    # every NVlabs tensor is used except q/kv (merged) and the unused
    # conv_seg; nothing else is dropped
    assert len(converted) == len(nv) - 2 - sum(
        '.attn.kv.' in k for k in nv)


def test_converted_checkpoint_loads_into_the_nvlabs_config(tiny_acdc,
                                                           tmp_path):
    """The model the NVlabs STAG config builds (shrunk) takes a converted
    checkpoint strictly, through the file converter too."""
    model, _ = build_from_config(NVLABS_SEG_CFG.format('tent'),
                                 tiny_options(tiny_acdc, head='nvlabs'))
    assert type(model.decode_head) is NVSegformerHead
    nv = nvlabs_state_dict(mit=mit_backbone(), embed=16, num_classes=19)
    converted = convert_nvlabs_segformer(nv)
    result = model.load_state_dict(converted, strict=True)
    assert not result.missing_keys and not result.unexpected_keys
    blk = 'backbone.layers.1.1.0.'
    torch.testing.assert_close(
        converted[blk + 'attn.attn.in_proj_weight'],
        torch.cat([nv['backbone.block2.0.attn.q.weight'],
                   nv['backbone.block2.0.attn.kv.weight']]))
    torch.testing.assert_close(
        converted[blk + 'ffn.layers.0.weight'][:, :, 0, 0],
        nv['backbone.block2.0.mlp.fc1.weight'])
    torch.testing.assert_close(converted['decode_head.conv_seg.weight'],
                               nv['decode_head.linear_pred.weight'])
    # the file converter writes a weights_only-loadable checkpoint
    src, dst = tmp_path / 'nv.pth', tmp_path / 'mm.pth'
    torch.save({'state_dict': nv, 'meta': {'iter': 160000}}, src)
    assert convert_nvlabs_checkpoint(str(src), str(dst)) == len(converted)
    saved = torch.load(dst, weights_only=True)
    assert set(saved['state_dict']) == set(converted)
    model.load_state_dict(saved['state_dict'], strict=True)


def test_converted_values_land_in_place():
    nv = nvlabs_state_dict()
    model = build_nvlabs_segmentor()
    model.load_state_dict(convert_nvlabs_segformer(nv), strict=True)
    sd = model.state_dict()
    blk = 'backbone.layers.1.1.1.'  # stage 2, second block
    nvb = 'backbone.block2.1.'
    # in_proj rows: [q; k; v], NVlabs kv rows: [k; v]
    w = sd[blk + 'attn.attn.in_proj_weight']
    width = WIDTHS[1]
    torch.testing.assert_close(w[:width], nv[nvb + 'attn.q.weight'])
    torch.testing.assert_close(w[width:2 * width],
                               nv[nvb + 'attn.kv.weight'][:width])
    torch.testing.assert_close(w[2 * width:],
                               nv[nvb + 'attn.kv.weight'][width:])
    torch.testing.assert_close(
        sd[blk + 'attn.attn.in_proj_bias'],
        torch.cat([nv[nvb + 'attn.q.bias'], nv[nvb + 'attn.kv.bias']]))
    torch.testing.assert_close(sd[blk + 'attn.attn.out_proj.weight'],
                               nv[nvb + 'attn.proj.weight'])
    # Linear -> 1x1 conv
    assert sd[blk + 'ffn.layers.0.weight'].shape == (4 * width, width, 1, 1)
    torch.testing.assert_close(sd[blk + 'ffn.layers.0.weight'][:, :, 0, 0],
                               nv[nvb + 'mlp.fc1.weight'])
    torch.testing.assert_close(sd[blk + 'ffn.layers.4.weight'][:, :, 0, 0],
                               nv[nvb + 'mlp.fc2.weight'])
    torch.testing.assert_close(sd[blk + 'ffn.layers.1.weight'],
                               nv[nvb + 'mlp.dwconv.dwconv.weight'])
    torch.testing.assert_close(sd[blk + 'attn.sr.weight'],
                               nv[nvb + 'attn.sr.weight'])
    torch.testing.assert_close(sd[blk + 'norm2.bias'], nv[nvb + 'norm2.bias'])
    torch.testing.assert_close(sd['backbone.layers.2.0.projection.weight'],
                               nv['backbone.patch_embed3.proj.weight'])
    torch.testing.assert_close(sd['backbone.layers.3.2.weight'],
                               nv['backbone.norm4.weight'])
    # head: the classifier is linear_pred, not NVlabs' unused conv_seg
    torch.testing.assert_close(sd['decode_head.conv_seg.weight'],
                               nv['decode_head.linear_pred.weight'])
    torch.testing.assert_close(sd['decode_head.linear_c3.proj.weight'],
                               nv['decode_head.linear_c3.proj.weight'])
    torch.testing.assert_close(sd['decode_head.linear_fuse.bn.running_var'],
                               nv['decode_head.linear_fuse.bn.running_var'])
    assert model.decode_head.conv_seg.weight.shape == (NUM_CLASSES, EMBED,
                                                       1, 1)


@pytest.mark.parametrize('stage, index', [(1, 0), (2, 1), (4, 0)])
def test_converted_block_computes_the_nvlabs_block(stage, index):
    """Functional check of the q/kv merge, the head split and the Mix-FFN
    reshape: the MMSeg block with converted weights computes what the NVlabs
    block (transcribed, with its eps values) computes with the original
    ones."""
    nv = nvlabs_state_dict()
    model = build_nvlabs_segmentor()
    model.load_state_dict(convert_nvlabs_segformer(nv), strict=True)
    block = model.backbone.layers[stage - 1][1][index]
    prefix = f'backbone.block{stage}.{index}.'
    p = {k[len(prefix):]: v for k, v in nv.items() if k.startswith(prefix)}
    width, hw = WIDTHS[stage - 1], (8, 16)
    x = torch.randn(2, hw[0] * hw[1], width,
                    generator=torch.Generator().manual_seed(stage))
    reference = nvref.Block(width, MIT['num_heads'][stage - 1],
                            MIT['mlp_ratio'],
                            sr_ratio=MIT['sr_ratios'][stage - 1]).eval()
    reference.load_state_dict(p, strict=True)
    with torch.no_grad():
        ours = block(x, hw)
        ref = reference(x, *hw)
    torch.testing.assert_close(ours, ref, rtol=1e-4, atol=1e-5)


def test_checkpoint_file_is_safe_and_plain(tmp_path):
    nv = nvlabs_state_dict()
    src, dst = tmp_path / 'nv.pth', tmp_path / 'out' / 'mm.pth'
    torch.save({'state_dict': nv, 'meta': {
        'CLASSES': ('a', 'b'), 'iter': 160000}}, src)
    n = convert_nvlabs_checkpoint(str(src), str(dst))
    saved = torch.load(dst, map_location='cpu', weights_only=True)
    assert set(saved) == {'state_dict', 'meta'}
    assert n == len(saved['state_dict'])
    model = build_nvlabs_segmentor()
    model.load_state_dict(saved['state_dict'], strict=True)
    meta = saved['meta']
    assert meta['num_tensors'] == n
    assert sorted(meta['dropped_keys']) == ['decode_head.conv_seg.bias',
                                            'decode_head.conv_seg.weight']
    assert meta['source_meta'] == {'CLASSES': ['a', 'b'], 'iter': 160000}

    def plain(v):
        if isinstance(v, dict):
            return all(isinstance(k, str) and plain(x) for k, x in v.items())
        if isinstance(v, list):
            return all(plain(x) for x in v)
        return isinstance(v, (str, int, float, bool, type(None)))

    assert plain(meta)
    # a top-level state dict and a DDP 'module.' prefix work too
    top = tmp_path / 'top.pth'
    torch.save({'module.' + k: v for k, v in nv.items()}, top)
    assert convert_nvlabs_checkpoint(str(top), str(tmp_path / 'b.pth')) == n


class NotATensor:
    """A pickled object that ``weights_only=True`` refuses."""


def test_legacy_pickle_needs_explicit_opt_in(tmp_path):
    src, dst = tmp_path / 'legacy.pth', tmp_path / 'mm.pth'
    torch.save({'state_dict': nvlabs_state_dict(),
                'meta': {'obj': NotATensor()}}, src)
    with pytest.raises(RuntimeError) as err:
        convert_nvlabs_checkpoint(str(src), str(dst))
    message = str(err.value)
    assert str(src) in message and 'weights_only=True' in message
    assert '--trust-pickle' in message
    assert 'allow_unsafe_pickle=True' in message
    assert not dst.exists()  # no silent fallback
    assert convert_nvlabs_checkpoint(str(src), str(dst),
                                     allow_unsafe_pickle=True) > 0
    torch.load(dst, weights_only=True)


def test_unknown_and_inconsistent_keys():
    nv = nvlabs_state_dict()
    bad = dict(nv, **{'backbone.block1.0.attn.qq.weight': torch.zeros(1),
                      'auxiliary_head.conv_seg.weight': torch.zeros(1)})
    with pytest.raises(ValueError, match='2 unknown') as err:
        convert_nvlabs_segformer(bad)
    assert 'backbone.block1.0.attn.qq.weight' in str(err.value)
    assert 'auxiliary_head.conv_seg.weight' in str(err.value)
    no_kv = {k: v for k, v in nv.items()
             if k != 'backbone.block2.0.attn.kv.weight'}
    with pytest.raises(ValueError, match='backbone.block2.0.attn.kv.weight'):
        convert_nvlabs_segformer(no_kv)
    no_q = {k: v for k, v in nv.items()
            if k != 'backbone.block2.0.attn.q.bias'}
    with pytest.raises(ValueError, match='backbone.block2.0.attn.q.bias'):
        convert_nvlabs_segformer(no_q)
    no_pred = {k: v for k, v in nv.items() if 'linear_pred' not in k}
    with pytest.raises(ValueError, match='linear_pred'):
        convert_nvlabs_segformer(no_pred)
    # an already converted (MMSeg) checkpoint is recognised as such
    with pytest.raises(ValueError, match='already in MMSeg format'):
        convert_nvlabs_segformer(convert_nvlabs_segformer(nv))
    # ImageNet MiT head keys are known and dropped
    with_head = dict(nv, **{'backbone.head.weight': torch.zeros(3, 32),
                            'backbone.head.bias': torch.zeros(3)})
    assert set(convert_nvlabs_segformer(with_head)) == set(
        convert_nvlabs_segformer(nv))


# --------------------------------------------------------------------- CLI
def test_cli_help_and_errors(tmp_path, capsys):
    tool = load_tool()
    with pytest.raises(SystemExit) as exit_:
        tool.main(['--help'])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert 'src' in out and 'dst' in out and '--trust-pickle' in out
    src, dst = tmp_path / 'legacy.pth', tmp_path / 'mm.pth'
    torch.save({'state_dict': nvlabs_state_dict(),
                'meta': {'obj': NotATensor()}}, src)
    with pytest.raises(SystemExit) as exit_:
        tool.main([str(src), str(dst)])
    assert '--trust-pickle' in str(exit_.value.code)
    tool.main([str(src), str(dst), '--trust-pickle'])
    assert 'converted' in capsys.readouterr().out
    bad = tmp_path / 'bad.pth'
    torch.save({'state_dict': {'foo.weight': torch.zeros(1)}}, bad)
    with pytest.raises(SystemExit) as exit_:
        tool.main([str(bad), str(dst)])
    assert 'foo.weight' in str(exit_.value.code)


def test_cli_subprocess(tmp_path):
    nv = nvlabs_state_dict()
    src, dst = tmp_path / 'nv.pth', tmp_path / 'mm.pth'
    torch.save({'state_dict': nv}, src)
    proc = tool_runs.run(
        [sys.executable, osp.join(REPO, 'tools',
                                  'convert_nvlabs_segformer.py'),
         str(src), str(dst)],
        capture_output=True, text=True, cwd=str(tmp_path), timeout=300)
    assert proc.returncode == 0, proc.stderr
    n = len(convert_nvlabs_segformer(copy.deepcopy(nv)))
    assert f'converted {n} tensors' in proc.stdout
    saved = torch.load(dst, weights_only=True)
    assert len(saved['state_dict']) == n
