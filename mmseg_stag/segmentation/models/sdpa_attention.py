"""MiT's efficient self-attention through ``scaled_dot_product_attention``.

MMSeg's ``EfficientMultiheadAttention`` calls ``nn.MultiheadAttention``
with ``need_weights=True`` (its default) on sequence-first views: PyTorch's
slow path, which materialises the ``[B, heads, Nq, Nk]`` attention matrix,
copies the inputs to sequence-first layouts and averages the weights over
the heads for a return value nobody reads. :class:`SDPAEfficientAttention`
computes the same outputs with the same parameters (state-dict keys
unchanged) through ``torch.nn.functional.scaled_dot_product_attention``,
whose flash / memory-efficient kernels a GPU runs.
"""
import torch
import torch.nn.functional as F
from mmseg.models.backbones import MixVisionTransformer
from mmseg.models.backbones.mit import EfficientMultiheadAttention
from mmseg.models.utils import nchw_to_nlc, nlc_to_nchw
from mmseg.registry import MODELS
from torch import nn

ATTENTION_MODES = ('mmseg', 'sdpa')


class SDPAEfficientAttention(EfficientMultiheadAttention):
    """``EfficientMultiheadAttention`` whose attention runs through
    ``scaled_dot_product_attention``; same modules, same parameters."""

    def forward(self, x, hw_shape, identity=None):
        x_kv = x
        if self.sr_ratio > 1:  # MMSeg's spatial reduction, as it is
            x_kv = self.norm(nchw_to_nlc(self.sr(nlc_to_nchw(x, hw_shape))))
        if identity is None:
            identity = x
        out = self.attn.out_proj(sdpa_attention(self.attn, x, x_kv))
        return identity + self.dropout_layer(self.proj_drop(out))


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


def use_attention(backbone: nn.Module, mode: str) -> None:
    """Run every ``EfficientMultiheadAttention`` of ``backbone`` as MMSeg
    does (``'mmseg'``) or through SDPA (``'sdpa'``), in place.

    Raises:
        ValueError: For another ``mode``.
    """
    if mode not in ATTENTION_MODES:
        raise ValueError(f'attention must be one of {ATTENTION_MODES}, got '
                         f'{mode!r}')
    cls = SDPAEfficientAttention if mode == 'sdpa' \
        else EfficientMultiheadAttention
    for module in backbone.modules():
        if isinstance(module, EfficientMultiheadAttention):
            # the same module and parameters, another forward
            module.__class__ = cls


@MODELS.register_module()
class SDPAMixVisionTransformer(MixVisionTransformer):
    """MMSeg's ``MixVisionTransformer`` (the MMSeg-head B5 configs'), its
    attention through SDPA (``NVMixVisionTransformer`` has the option
    ``attention='sdpa'``)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        use_attention(self, 'sdpa')
