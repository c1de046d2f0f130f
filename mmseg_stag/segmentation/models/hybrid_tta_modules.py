"""Hybrid-TTA's modules on an MMSeg MiT (docs/methods.md), following
hhhyyeee/Hybrid-TTA: mmseg/models/pet/adapter.py,
backbones/mix_transformer_cvp.py, backbones/simmim.py,
segmentors/simmim_encoder_decoder.py (MaskGenerator), necks/simmim_neck.py
and mmpretrain's PixelReconstructionLoss."""
import math
from typing import Dict, List, Sequence, Tuple

import numpy as np
import torch
import torch.nn as nn
from mmcv.cnn import ConvModule
from mmseg.models.backbones import MixVisionTransformer
from mmseg.models.utils import nchw_to_nlc, nlc_to_nchw

from mmseg_stag.checkpoint import register_module_adder
from .nvlabs_segformer_head import TokenMLP, embed_and_fuse

ADAPTER_INITS = ('backbone', 'zero_up')


class ParallelAdapter(nn.Module):
    """``Linear(d, hidden) -> GELU -> Linear(hidden, d)``, times a learnable
    scale (1 at the start): the authors' ``Adapter`` with ``Scaler(None)``.

    ``init='backbone'``: truncated normal (std 0.02) weights and zero
    biases, what the authors' adapters start from because the MiT's
    ``_init_weights`` runs after they are attached (mix_transformer_cvp.py
    :424 then :448); ``'zero_up'``: their ``reset_parameters``, a zero
    output at the start (a quirk fixed, off by default).
    """

    def __init__(self, dims: int, hidden: int = 5, init: str = 'backbone'):
        super().__init__()
        if init not in ADAPTER_INITS:
            raise ValueError(f'adapter_init must be one of {ADAPTER_INITS},'
                             f' got {init!r}')
        self.down = nn.Linear(dims, hidden)
        self.act = nn.GELU()
        self.up = nn.Linear(hidden, dims)
        self.scale = nn.Parameter(torch.tensor(1.0))
        if init == 'backbone':
            for linear in (self.down, self.up):
                nn.init.trunc_normal_(linear.weight, std=.02)
                nn.init.zeros_(linear.bias)
        else:
            nn.init.kaiming_uniform_(self.down.weight, a=math.sqrt(5))
            for tensor in (self.down.bias, self.up.weight, self.up.bias):
                nn.init.zeros_(tensor)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.up(self.act(self.down(x))) * self.scale


class AdaptedMixFFN(nn.Module):
    """MMSeg's ``MixFFN`` with a :class:`ParallelAdapter` beside it:
    ``identity + drop_path(mlp(x) + adapter(x))`` (the authors' parallel
    mode). Keeps the MixFFN's submodules under their names, so the
    checkpoint's keys load unchanged."""

    def __init__(self, ffn: nn.Module, adapter: ParallelAdapter):
        super().__init__()
        self.layers = ffn.layers
        self.dropout_layer = ffn.dropout_layer
        self.adapter = adapter

    def forward(self, x, hw_shape, identity=None):
        out = nchw_to_nlc(self.layers(nlc_to_nchw(x, hw_shape)))
        out = out + self.adapter(x)
        return (x if identity is None else identity) + self.dropout_layer(out)


class StageOneMaskToken(nn.Module):
    """A learned token (zeros at the start) that replaces the masked tokens
    of the first patch embedding, after its norm (backbones/simmim.py:47-53).
    """

    def __init__(self, dims: int):
        super().__init__()
        self.mask_token = nn.Parameter(torch.zeros(1, 1, dims))

    def forward(self, x: torch.Tensor,
                token_mask: torch.Tensor) -> torch.Tensor:
        """Tokens ``x [N, h*w, C]`` with those under ``token_mask [1, h, w]``
        (1: masked) replaced by the mask token."""
        w = token_mask.flatten(1).unsqueeze(-1).type_as(x)
        return x * (1. - w) + self.mask_token.expand_as(x) * w


def masked_mit_features(backbone: nn.Module, x: torch.Tensor,
                        token_mask: torch.Tensor) -> List[torch.Tensor]:
    """The MiT's levels with the first patch embedding's tokens under
    ``token_mask`` replaced by ``backbone.mask_token_embed``'s token: MMSeg
    1.2.2's ``MixVisionTransformer.forward`` line for line, the mask applied
    after ``layers[0][0]`` (the authors' mix_transformer_cvp.py, masked
    through backbones/simmim.py:47-53)."""
    outs = []
    for i, layer in enumerate(backbone.layers):
        x, hw_shape = layer[0](x)
        if i == 0:
            x = backbone.mask_token_embed(x, token_mask)
        for block in layer[1]:
            x = block(x, hw_shape)
        x = layer[2](x)
        x = nlc_to_nchw(x, hw_shape)
        if i in backbone.out_indices:
            outs.append(x)
    return outs


class ReconstructionNeck(nn.Module):
    """SimMIM's SegFormer decoder: NVlabs' per-level MLPs and fusion, then
    a 1x1 conv to ``stride**2 * 3`` channels and a PixelShuffle to the
    input's size (necks/simmim_neck.py, ``SimMIMSegFormerDecoder``)."""

    def __init__(self, in_channels: Sequence[int], embed_dim: int = 768,
                 encoder_stride: int = 4):
        super().__init__()
        for level, channels in enumerate(in_channels, start=1):
            self.add_module(f'linear_c{level}', TokenMLP(channels, embed_dim))
        self.linear_fuse = ConvModule(4 * embed_dim, embed_dim, 1,
                                      norm_cfg=dict(type='BN'))
        self.decoder = nn.Sequential(
            nn.Conv2d(embed_dim, encoder_stride**2 * 3, kernel_size=1),
            nn.PixelShuffle(encoder_stride))

    def forward(self, features: List[torch.Tensor]) -> torch.Tensor:
        """Return the ``[N, 3, H, W]`` reconstruction."""
        return self.decoder(embed_and_fuse(self, features))


class PatchMaskGenerator:
    """SimMIM's mask: exactly ``ceil(ratio * patches)`` masked
    ``mask_patch`` x ``mask_patch`` patches, drawn as the authors' global
    ``np.random.permutation`` does but from a generator of its own (seeded
    as their ``np.random.seed(42)``, scripts/ours.py; its state is part of
    the run state). ``model_patch_size``: the first level's stride.
    """

    def __init__(self, mask_patch_size: int = 32, model_patch_size: int = 4,
                 mask_ratio: float = 0.6, seed: int = 42):
        if mask_patch_size % model_patch_size:
            raise ValueError(f'mask_patch_size ({mask_patch_size}) must be a '
                             f'multiple of the MiT stride {model_patch_size}')
        if not 0.0 <= mask_ratio <= 1.0:
            raise ValueError(f'mask_ratio must be in [0, 1], got {mask_ratio}')
        self.mask_patch_size = int(mask_patch_size)
        self.scale = mask_patch_size // model_patch_size
        self.mask_ratio = float(mask_ratio)
        self.rng = np.random.RandomState(seed)

    def rng_state(self) -> dict:
        """The generator's state as tensors and numbers (a run state is
        read with ``weights_only=True``)."""
        kind, keys, pos, has_gauss, cached = self.rng.get_state()
        return dict(kind=kind, keys=torch.from_numpy(keys.astype(np.int64)),
                    pos=int(pos), has_gauss=int(has_gauss),
                    cached_gaussian=float(cached))

    def load_rng_state(self, state: dict) -> None:
        self.rng.set_state((state['kind'], state['keys'].numpy().astype(
            np.uint32), state['pos'], state['has_gauss'],
            state['cached_gaussian']))

    def __call__(self, image_size: Tuple[int, int]) -> torch.Tensor:
        """Return a ``[1, H / stride, W / stride]`` int64 token mask.

        Raises:
            ValueError: If the size is not a multiple of the mask patch.
        """
        height, width = image_size
        if height % self.mask_patch_size or width % self.mask_patch_size:
            raise ValueError(
                f'Hybrid-TTA masks {self.mask_patch_size}-px patches: the '
                f'input size {width}x{height} must be a multiple of it (the '
                'authors resize ACDC to 960x544, configs/_base_/datasets/'
                'acdc_continual_960x544.py)')
        rows, cols = height // self.mask_patch_size, width // \
            self.mask_patch_size
        count = rows * cols
        masked = self.rng.permutation(count)[:int(np.ceil(
            count * self.mask_ratio))]
        mask = np.zeros(count, dtype=int)
        mask[masked] = 1
        mask = mask.reshape(rows, cols).repeat(self.scale, axis=0).repeat(
            self.scale, axis=1)
        return torch.from_numpy(mask).unsqueeze(0)


def masked_l1(reconstruction: torch.Tensor, image: torch.Tensor,
              token_mask: torch.Tensor, stride: int = 4) -> torch.Tensor:
    """Mean ``|rec - image|`` over the masked pixels and the 3 channels:
    ``sum(|rec - img| * mask) / sum(mask) / 3`` (PixelReconstructionLoss
    with ``channel=3``; the mask is not repeated over the batch)."""
    mask = token_mask.repeat_interleave(stride, 1).repeat_interleave(
        stride, 2).unsqueeze(1).to(reconstruction)
    return ((reconstruction - image).abs() * mask).sum() / mask.sum() / 3


@register_module_adder('hybrid_tta')
def attach_modules(model: nn.Module, adapter_hidden: int = 5,
                   adapter_init: str = 'backbone',
                   neck_embed_dim: int = 768) -> Dict[str, int]:
    """Attach the adapters, the mask token and the reconstruction neck to an
    MMSeg segmentor with a MiT backbone; return their parameter counts.
    ``model.added_modules`` records them (``type='hybrid_tta'`` and the
    options): an adapted checkpoint's ``meta['added_modules']``, which
    the strict loader attaches again (``checkpoint.attach_added_modules``).

    Raises:
        ValueError: If the backbone is not a ``MixVisionTransformer``.
    """
    backbone = model.backbone
    if not isinstance(backbone, MixVisionTransformer):
        raise ValueError('Hybrid-TTA needs a MiT backbone '
                         '(MixVisionTransformer, SegFormer), got '
                         f'{type(backbone).__name__}')
    adapters = []
    for stage in backbone.layers:
        for block in stage[1]:
            dims = block.norm2.normalized_shape[0]
            adapter = ParallelAdapter(dims, adapter_hidden, adapter_init)
            block.ffn = AdaptedMixFFN(block.ffn, adapter)
            adapters.append(adapter)
    first_dims = backbone.layers[0][1][0].norm2.normalized_shape[0]
    backbone.mask_token_embed = StageOneMaskToken(first_dims)
    model.recon_neck = ReconstructionNeck(model.decode_head.in_channels,
                                          neck_embed_dim)

    # on the model's device and dtype, as the checkpoint's weights are
    like = next(backbone.parameters())
    for module in adapters + [backbone.mask_token_embed, model.recon_neck]:
        module.to(device=like.device, dtype=like.dtype)
    model.added_modules = dict(type='hybrid_tta',
                               adapter_hidden=int(adapter_hidden),
                               adapter_init=adapter_init,
                               neck_embed_dim=int(neck_embed_dim))

    def count(modules):
        return sum(p.numel() for m in modules for p in m.parameters())

    return dict(adapters=count(adapters),
                mask_token=count([backbone.mask_token_embed]),
                recon_neck=count([model.recon_neck]),
                num_adapters=len(adapters))
