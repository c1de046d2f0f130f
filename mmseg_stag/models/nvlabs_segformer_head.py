"""The decode head of NVlabs' original SegFormer release."""
from typing import List

import torch
import torch.nn as nn
from mmcv.cnn import ConvModule
from mmseg.models.decode_heads.decode_head import BaseDecodeHead
from mmseg.models.utils import resize
from mmseg.registry import MODELS


class TokenMLP(nn.Module):
    """A per-pixel linear projection (NVlabs' ``MLP``: one ``proj`` layer)."""

    def __init__(self, in_channels: int, embedding_dim: int):
        super().__init__()
        self.proj = nn.Linear(in_channels, embedding_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, _, h, w = x.shape
        tokens = self.proj(x.flatten(2).transpose(1, 2))
        return tokens.transpose(1, 2).reshape(n, -1, h, w)


@MODELS.register_module()
class NVSegformerHead(BaseDecodeHead):
    """SegFormer head as in NVlabs' ``segformer_head.py`` (MMSeg 0.x fork).

    Each of the four MiT levels is projected to ``embedding_dim`` by a linear
    layer (``linear_c{1..4}.proj``), upsampled to the 1/4-resolution level,
    concatenated in the order ``[c4, c3, c2, c1]``, fused by a 1x1
    conv + BN + ReLU (``linear_fuse``) and classified by a 1x1 conv. NVlabs
    names the classifier ``linear_pred``; here it is BaseDecodeHead's
    ``conv_seg`` (``tools/convert_nvlabs_segformer.py`` renames the keys), so
    the classifier input is the ``embedding_dim``-d fused feature (768 for
    B5, the ``D`` of STAG).

    Args:
        embedding_dim (int): width of the projections and of the fused
            feature. Default: 768.
        **kwargs: BaseDecodeHead's arguments; ``channels`` must equal
            ``embedding_dim`` and ``input_transform`` is
            ``'multiple_select'``.
    """

    def __init__(self, embedding_dim: int = 768, **kwargs):
        kwargs.setdefault('channels', embedding_dim)
        if kwargs['channels'] != embedding_dim:
            raise ValueError(
                f'NVSegformerHead: channels ({kwargs["channels"]}) must equal '
                f'embedding_dim ({embedding_dim}): the classifier reads the '
                'fused feature')
        super().__init__(input_transform='multiple_select', **kwargs)
        if len(self.in_channels) != 4:
            raise ValueError('NVSegformerHead expects 4 input levels, got '
                             f'in_channels={self.in_channels}')
        self.embedding_dim = embedding_dim
        for level, in_ch in enumerate(self.in_channels, start=1):
            self.add_module(f'linear_c{level}', TokenMLP(in_ch, embedding_dim))
        self.linear_fuse = ConvModule(
            in_channels=4 * embedding_dim,
            out_channels=embedding_dim,
            kernel_size=1,
            norm_cfg=self.norm_cfg)

    def forward(self, inputs: List[torch.Tensor]) -> torch.Tensor:
        levels = self._transform_inputs(inputs)
        size = levels[0].shape[2:]
        projected = []
        for level in (4, 3, 2, 1):
            x = getattr(self, f'linear_c{level}')(levels[level - 1])
            if level != 1:
                x = resize(x, size=size, mode='bilinear',
                           align_corners=False)
            projected.append(x)
        fused = self.linear_fuse(torch.cat(projected, dim=1))
        return self.cls_seg(fused)
