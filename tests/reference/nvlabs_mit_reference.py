"""NVlabs' MiT as the authors wrote it (github.com/NVlabs/SegFormer),
transcribed for the tests: ``DWConv``, ``Mlp``, ``Attention``, ``Block``,
``OverlapPatchEmbed`` and ``MixVisionTransformer`` (``forward_features``) of
``mmseg/models/backbones/mix_transformer.py``, with the norms the ``mit_b*``
classes build.

What matters here and is kept as they wrote it: the parameter names (those
of the released checkpoints), the order of the operations and the LayerNorm
eps values. ``OverlapPatchEmbed.norm`` and ``Attention.norm`` are plain
``nn.LayerNorm`` (eps 1e-5, PyTorch's default); the block norms
``norm1``/``norm2`` and the stage norms ``norm1..norm4`` take
``norm_layer``, which every ``mit_b*`` sets to
``partial(nn.LayerNorm, eps=1e-6)``.

Left out, as they do nothing at inference with the released settings:
dropout and drop path (identities in eval mode / at rate 0), the weight
initialisation (the tests set their own weights), ``img_size`` (only used
for unused attributes), the classification head and timm.
"""
from functools import partial

import torch.nn as nn

#: ``norm_layer`` of NVlabs' ``mit_b0`` .. ``mit_b5``
MIT_NORM_LAYER = partial(nn.LayerNorm, eps=1e-6)


class DWConv(nn.Module):
    """``DWConv``: 3x3 depth-wise conv on the tokens."""

    def __init__(self, dim):
        super().__init__()
        self.dwconv = nn.Conv2d(dim, dim, 3, 1, 1, bias=True, groups=dim)

    def forward(self, x, H, W):
        B, N, C = x.shape
        x = x.transpose(1, 2).view(B, C, H, W)
        return self.dwconv(x).flatten(2).transpose(1, 2)


class Mlp(nn.Module):
    """``Mlp`` (Mix-FFN): fc1 -> DWConv -> GELU -> fc2."""

    def __init__(self, in_features, hidden_features):
        super().__init__()
        self.fc1 = nn.Linear(in_features, hidden_features)
        self.dwconv = DWConv(hidden_features)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden_features, in_features)

    def forward(self, x, H, W):
        return self.fc2(self.act(self.dwconv(self.fc1(x), H, W)))


class Attention(nn.Module):
    """``Attention`` with spatial reduction: keys and values from an
    ``sr_ratio``-strided conv of the tokens, normalised by ``self.norm``
    (``nn.LayerNorm(dim)``: eps 1e-5)."""

    def __init__(self, dim, num_heads, qkv_bias=True, sr_ratio=1):
        super().__init__()
        assert dim % num_heads == 0
        self.num_heads = num_heads
        self.scale = (dim // num_heads)**-0.5
        self.q = nn.Linear(dim, dim, bias=qkv_bias)
        self.kv = nn.Linear(dim, dim * 2, bias=qkv_bias)
        self.proj = nn.Linear(dim, dim)
        self.sr_ratio = sr_ratio
        if sr_ratio > 1:
            self.sr = nn.Conv2d(dim, dim, kernel_size=sr_ratio,
                                stride=sr_ratio)
            self.norm = nn.LayerNorm(dim)  # their default eps, not 1e-6

    def forward(self, x, H, W):
        B, N, C = x.shape
        heads = self.num_heads
        q = self.q(x).reshape(B, N, heads, C // heads).permute(0, 2, 1, 3)
        if self.sr_ratio > 1:
            x_ = x.permute(0, 2, 1).reshape(B, C, H, W)
            x_ = self.sr(x_).reshape(B, C, -1).permute(0, 2, 1)
            x_ = self.norm(x_)
        else:
            x_ = x
        kv = self.kv(x_).reshape(B, -1, 2, heads, C // heads).permute(
            2, 0, 3, 1, 4)
        k, v = kv[0], kv[1]
        attn = ((q @ k.transpose(-2, -1)) * self.scale).softmax(dim=-1)
        x = (attn @ v).transpose(1, 2).reshape(B, N, C)
        return self.proj(x)


class Block(nn.Module):
    """``Block``: pre-norm attention and Mix-FFN, each with a residual."""

    def __init__(self, dim, num_heads, mlp_ratio, qkv_bias=True,
                 norm_layer=MIT_NORM_LAYER, sr_ratio=1):
        super().__init__()
        self.norm1 = norm_layer(dim)
        self.attn = Attention(dim, num_heads, qkv_bias=qkv_bias,
                              sr_ratio=sr_ratio)
        self.norm2 = norm_layer(dim)
        self.mlp = Mlp(dim, int(dim * mlp_ratio))

    def forward(self, x, H, W):
        x = x + self.attn(self.norm1(x), H, W)
        return x + self.mlp(self.norm2(x), H, W)


class OverlapPatchEmbed(nn.Module):
    """``OverlapPatchEmbed``: strided conv with ``patch_size // 2`` padding,
    then ``nn.LayerNorm(embed_dim)`` (eps 1e-5)."""

    def __init__(self, patch_size, stride, in_chans, embed_dim):
        super().__init__()
        self.proj = nn.Conv2d(in_chans, embed_dim, kernel_size=patch_size,
                              stride=stride, padding=patch_size // 2)
        self.norm = nn.LayerNorm(embed_dim)  # their default eps, not 1e-6

    def forward(self, x):
        x = self.proj(x)
        _, _, H, W = x.shape
        return self.norm(x.flatten(2).transpose(1, 2)), H, W


class MixVisionTransformer(nn.Module):
    """``MixVisionTransformer`` (``forward`` = ``forward_features``): four
    stages ``patch_embed{i}`` -> ``block{i}`` -> ``norm{i}``, each output
    reshaped to ``[B, C, H, W]``. Patch sizes 7, 3, 3, 3 and strides
    4, 2, 2, 2 as in their constructor; ``norm_layer`` defaults to the
    ``mit_b*`` one."""

    def __init__(self, in_chans=3, embed_dims=(64, 128, 320, 512),
                 num_heads=(1, 2, 5, 8), mlp_ratios=(4, 4, 4, 4),
                 qkv_bias=True, norm_layer=MIT_NORM_LAYER,
                 depths=(3, 6, 40, 3), sr_ratios=(8, 4, 2, 1)):
        super().__init__()
        self.depths = depths
        for i in range(4):
            # names as theirs: patch_embed1..4, block1..4, norm1..4
            setattr(self, f'patch_embed{i + 1}', OverlapPatchEmbed(
                patch_size=7 if i == 0 else 3, stride=4 if i == 0 else 2,
                in_chans=in_chans if i == 0 else embed_dims[i - 1],
                embed_dim=embed_dims[i]))
            setattr(self, f'block{i + 1}', nn.ModuleList([
                Block(embed_dims[i], num_heads[i], mlp_ratios[i],
                      qkv_bias=qkv_bias, norm_layer=norm_layer,
                      sr_ratio=sr_ratios[i]) for _ in range(depths[i])]))
            setattr(self, f'norm{i + 1}', norm_layer(embed_dims[i]))

    def forward(self, x):
        B = x.shape[0]
        outs = []
        for i in range(1, 5):
            x, H, W = getattr(self, f'patch_embed{i}')(x)
            for blk in getattr(self, f'block{i}'):
                x = blk(x, H, W)
            x = getattr(self, f'norm{i}')(x)
            x = x.reshape(B, H, W, -1).permute(0, 3, 1, 2).contiguous()
            outs.append(x)
        return outs

