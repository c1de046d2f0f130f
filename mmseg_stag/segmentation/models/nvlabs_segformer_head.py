"""The decode head of NVlabs' original SegFormer release, for MMSeg 1.x."""
from typing import List, Optional, Sequence

import torch
import torch.nn as nn
from mmcv.cnn import ConvModule
from mmseg.models.decode_heads.decode_head import BaseDecodeHead
from mmseg.models.utils import resize
from mmseg.registry import MODELS


class TokenMLP(nn.Module):
    """Per-pixel linear embedding of a feature map, NVlabs' ``MLP``."""

    def __init__(self, in_channels: int, embedding_dim: int):
        super().__init__()
        self.proj = nn.Linear(in_channels, embedding_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, _, h, w = x.shape
        tokens = self.proj(x.flatten(2).transpose(1, 2))  # [N, HW, E]
        return tokens.transpose(1, 2).reshape(n, -1, h, w)


def embed_and_fuse(module: nn.Module,
                   levels: Sequence[torch.Tensor]) -> torch.Tensor:
    """NVlabs' MLP decoder: each level through ``module.linear_c{i}``,
    resized to the first level's size, concatenated c4..c1 and fused by
    ``module.linear_fuse``."""
    c1, c2, c3, c4 = levels
    size = c1.shape[2:]
    embedded = []
    for level, feat in ((4, c4), (3, c3), (2, c2), (1, c1)):
        x = getattr(module, f'linear_c{level}')(feat)
        if level != 1:
            x = resize(x, size=size, mode='bilinear', align_corners=False)
        embedded.append(x)
    return module.linear_fuse(torch.cat(embedded, dim=1))


@MODELS.register_module()
class NVSegformerHead(BaseDecodeHead):
    """SegFormer's all-MLP decode head as released by NVlabs.

    Follows NVlabs/SegFormer's ``mmseg/models/decode_heads/segformer_head.py``.

    Args:
        embedding_dim (int): Width of the per-level projections and of the
            fused feature map. Default: 768.
        channels (int, optional): Must equal ``embedding_dim`` (None: it).
        in_channels, in_index (Sequence[int]): Of the four input levels.
        input_transform (str): Must be 'multiple_select'.
        **kwargs: The other arguments of ``BaseDecodeHead``.

    Raises:
        ValueError: If ``channels``, ``input_transform`` or the number of
            levels do not fit.
    """

    def __init__(self,
                 embedding_dim: int = 768,
                 in_channels: Sequence[int] = (64, 128, 320, 512),
                 channels: Optional[int] = None,
                 in_index: Sequence[int] = (0, 1, 2, 3),
                 input_transform: str = 'multiple_select',
                 **kwargs):
        if channels not in (None, embedding_dim):
            raise ValueError(
                f'NVSegformerHead: channels ({channels}) must equal '
                f'embedding_dim ({embedding_dim}): the classifier conv_seg '
                'reads the fused embedding_dim-d feature')
        if input_transform != 'multiple_select':
            raise ValueError('NVSegformerHead needs input_transform='
                             f"'multiple_select', got {input_transform!r}")
        if len(in_channels) != 4 or len(in_index) != 4:
            raise ValueError(
                'NVSegformerHead expects 4 input levels, got '
                f'in_channels={list(in_channels)}, in_index={list(in_index)}')
        super().__init__(
            in_channels=list(in_channels),
            channels=embedding_dim,
            in_index=list(in_index),
            input_transform=input_transform,
            **kwargs)
        self.embedding_dim = embedding_dim
        for level, level_channels in enumerate(self.in_channels, start=1):
            self.add_module(f'linear_c{level}',
                            TokenMLP(level_channels, embedding_dim))
        self.linear_fuse = ConvModule(
            in_channels=4 * embedding_dim,
            out_channels=embedding_dim,
            kernel_size=1,
            norm_cfg=self.norm_cfg if self.norm_cfg is not None else dict(
                type='BN', requires_grad=True),
            act_cfg=self.act_cfg)

    def forward(self, inputs: List[torch.Tensor]) -> torch.Tensor:
        """Return logits ``[N, num_classes, H/4, W/4]`` at ``c1``'s size."""
        fused = embed_and_fuse(self, self._transform_inputs(inputs))
        return self.cls_seg(fused)  # dropout, then conv_seg
