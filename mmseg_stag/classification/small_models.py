"""Small BN, GN and LN classifiers for the offline demo and the tests."""
import torch
import torch.nn as nn
import torch.nn.functional as F

from .registry import CLS_MODELS


@CLS_MODELS.register_module()
class SmallCNN(nn.Module):
    """Four 3x3 conv-norm-ReLU layers (``width`` channels first; ``norm``
    ``'BN'`` or ``'GN'`` of ``groups``), global average pooling and ``fc``.
    """

    def __init__(self, num_classes: int = 10, width: int = 16,
                 norm: str = 'BN', groups: int = 8):
        super().__init__()
        if norm not in ('BN', 'GN'):
            raise ValueError(
                f"SmallCNN norm must be 'BN' or 'GN', got {norm!r}")
        chans = [3, width, 2 * width, 2 * width, 4 * width]
        strides = [1, 2, 1, 2]
        layers = []
        for i, stride in enumerate(strides):
            layers += [nn.Conv2d(chans[i], chans[i + 1], 3, stride, 1,
                                 bias=False),
                       nn.BatchNorm2d(chans[i + 1]) if norm == 'BN' else
                       nn.GroupNorm(min(groups, chans[i + 1]), chans[i + 1]),
                       nn.ReLU(inplace=True)]
        self.features = nn.Sequential(*layers)
        self.fc = nn.Linear(chans[-1], num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.features(x).mean((2, 3)))


class _Block(nn.Module):
    """Pre-norm transformer block: LN-attention, LN-MLP."""

    def __init__(self, dim: int, heads: int, mlp_ratio: int):
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, mlp_ratio * dim), nn.GELU(),
                                 nn.Linear(mlp_ratio * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, t, d = x.shape
        qkv = self.qkv(self.norm1(x)).view(n, t, 3, self.heads,
                                           d // self.heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4)
        att = F.scaled_dot_product_attention(q, k, v)
        x = x + self.proj(att.transpose(1, 2).reshape(n, t, d))
        return x + self.mlp(self.norm2(x))


@CLS_MODELS.register_module()
class SmallViT(nn.Module):
    """A LayerNorm-only ViT with mean pooling over tokens and ``head``."""

    def __init__(self, num_classes: int = 10, img_size: int = 32,
                 patch_size: int = 4, dim: int = 64, depth: int = 4,
                 heads: int = 4, mlp_ratio: int = 2):
        super().__init__()
        self.patch_embed = nn.Conv2d(3, dim, patch_size, patch_size)
        tokens = (img_size // patch_size)**2
        self.pos_embed = nn.Parameter(torch.zeros(1, tokens, dim))
        nn.init.trunc_normal_(self.pos_embed, std=0.02)
        self.blocks = nn.Sequential(
            *[_Block(dim, heads, mlp_ratio) for _ in range(depth)])
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch_embed(x).flatten(2).transpose(1, 2) + self.pos_embed
        x = self.norm(self.blocks(x))
        return self.head(x.mean(1))
