"""MiT's GPU options: the same modules and parameters, other forwards
(docs/running.md).

* ``attention='sdpa'``: MMSeg calls ``nn.MultiheadAttention`` with
  ``need_weights=True``: PyTorch's slow path, which materialises the
  attention matrix and averages it over the heads for a return value
  nobody reads. ``scaled_dot_product_attention`` runs flash /
  memory-efficient kernels on a GPU.
* ``token_maps='view'``: MMSeg copies the tokens ``[B, HW, C]`` into a
  ``[B, C, H, W]`` map for every convolution of a block and back; the
  sequence is already a channels-last map, so views do without the copies.
"""
import torch
import torch.nn.functional as F
from mmseg.models.backbones import MixVisionTransformer
from mmseg.models.backbones.mit import EfficientMultiheadAttention, MixFFN
from mmseg.models.utils import nchw_to_nlc, nlc_to_nchw
from mmseg.registry import MODELS
from torch import nn

ATTENTION_MODES = ('mmseg', 'sdpa')
TOKEN_MAP_MODES = ('copy', 'view')


def tokens_as_map(x: torch.Tensor, hw_shape) -> torch.Tensor:
    """``[B, HW, C]`` tokens as a ``[B, C, H, W]`` map, a channels-last
    view (MMSeg's ``nlc_to_nchw`` copies)."""
    return x.unflatten(1, tuple(hw_shape)).permute(0, 3, 1, 2)


def map_as_tokens(x: torch.Tensor) -> torch.Tensor:
    """``[B, C, H, W]`` as ``[B, HW, C]`` tokens: a view, contiguous when
    the map is channels-last (MMSeg's ``nchw_to_nlc`` copies)."""
    return x.flatten(2).transpose(1, 2)


class SDPAEfficientAttention(EfficientMultiheadAttention):
    """``EfficientMultiheadAttention`` whose attention runs through
    ``scaled_dot_product_attention``; same modules, same parameters."""

    #: the spatial reduction on views of the tokens (``token_maps='view'``)
    token_map_views = False

    def forward(self, x, hw_shape, identity=None):
        x_kv = x
        if self.sr_ratio > 1:  # MMSeg's spatial reduction
            x_kv = self.norm(reduce_tokens(self.sr, x, hw_shape,
                                           self.token_map_views))
        out = self.attn.out_proj(sdpa_attention(self.attn, x, x_kv))
        return (x if identity is None else identity) + self.dropout_layer(
            self.proj_drop(out))


class ViewSDPAEfficientAttention(SDPAEfficientAttention):
    """:class:`SDPAEfficientAttention` with its spatial reduction on views
    of the tokens."""

    token_map_views = True


class ViewEfficientAttention(EfficientMultiheadAttention):
    """MMSeg's attention with its spatial reduction on views of the
    tokens."""

    def forward(self, x, hw_shape, identity=None):
        if self.sr_ratio == 1:
            return super().forward(x, hw_shape, identity)
        x_kv = self.norm(reduce_tokens(self.sr, x, hw_shape, True))
        out = self.attn(query=x.transpose(0, 1), key=x_kv.transpose(0, 1),
                        value=x_kv.transpose(0, 1))[0].transpose(0, 1)
        return (x if identity is None else identity) + self.dropout_layer(
            self.proj_drop(out))


class ViewMixFFN(MixFFN):
    """MMSeg's ``MixFFN`` with its convolutions on views of the tokens."""

    def forward(self, x, hw_shape, identity=None):
        out = map_as_tokens(self.layers(tokens_as_map(x, hw_shape)))
        return (x if identity is None else identity) + self.dropout_layer(
            out)


def reduce_tokens(sr: nn.Module, x: torch.Tensor, hw_shape,
                  views: bool) -> torch.Tensor:
    """The attention's spatial-reduction convolution on the tokens."""
    if views:
        return map_as_tokens(sr(tokens_as_map(x, hw_shape)))
    return nchw_to_nlc(sr(nlc_to_nchw(x, hw_shape)))


def sdpa_attention(attn: nn.MultiheadAttention, x_q: torch.Tensor,
                   x_kv: torch.Tensor) -> torch.Tensor:
    """``attn``'s attention of batch-first ``x_q [B, Nq, C]`` over
    ``x_kv [B, Nk, C]``, before its output projection: ``[B, Nq, C]``."""
    b, n_q, c = x_q.shape
    heads = attn.num_heads
    weight, bias = attn.in_proj_weight, attn.in_proj_bias
    bias_q, bias_kv = (None, None) if bias is None else (bias[:c], bias[c:])
    if x_kv is x_q:  # one projection for q, k and v
        q, k, v = F.linear(x_q, weight, bias).chunk(3, dim=-1)
    else:
        q = F.linear(x_q, weight[:c], bias_q)
        k, v = F.linear(x_kv, weight[c:], bias_kv).chunk(2, dim=-1)

    def split(t):  # [B, N, C] -> [B, heads, N, C / heads], a view
        return t.unflatten(-1, (heads, c // heads)).transpose(1, 2)

    out = F.scaled_dot_product_attention(
        split(q), split(k), split(v),
        dropout_p=attn.dropout if attn.training else 0.0)
    return out.transpose(1, 2).reshape(b, n_q, c)


#: (attention, token_maps) -> the attention's class
ATTENTION_CLASSES = {
    ('mmseg', 'copy'): EfficientMultiheadAttention,
    ('mmseg', 'view'): ViewEfficientAttention,
    ('sdpa', 'copy'): SDPAEfficientAttention,
    ('sdpa', 'view'): ViewSDPAEfficientAttention,
}


def use_attention(backbone: nn.Module, mode: str,
                  token_maps: str = 'copy') -> None:
    """Run ``backbone``'s attention as MMSeg does (``'mmseg'``) or through
    SDPA, and its convolutions on copies of the tokens (``'copy'``) or on
    views, in place. MixFFNs that another module wraps (Hybrid-TTA's
    adapters) keep theirs.

    Raises:
        ValueError: For another ``mode`` or ``token_maps``.
    """
    for name, value, modes in (('attention', mode, ATTENTION_MODES),
                               ('token_maps', token_maps, TOKEN_MAP_MODES)):
        if value not in modes:
            raise ValueError(f'{name} must be one of {modes}, got {value!r}')
    for module in backbone.modules():
        if isinstance(module, EfficientMultiheadAttention):
            module.__class__ = ATTENTION_CLASSES[(mode, token_maps)]
        elif isinstance(module, MixFFN):
            module.__class__ = ViewMixFFN if token_maps == 'view' else MixFFN


@MODELS.register_module()
class SDPAMixVisionTransformer(MixVisionTransformer):
    """MMSeg's ``MixVisionTransformer`` (the MMSeg-head B5 configs'), its
    attention through SDPA and its convolutions on views of the tokens
    (``NVMixVisionTransformer`` has both as options)."""

    def __init__(self, token_maps: str = 'view', **kwargs):
        super().__init__(**kwargs)
        use_attention(self, 'sdpa', token_maps)
