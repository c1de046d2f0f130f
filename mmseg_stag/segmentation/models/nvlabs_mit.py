"""MMSeg's MiT with the LayerNorm eps values of NVlabs' release."""
from mmseg.models.backbones import MixVisionTransformer
from mmseg.registry import MODELS
from torch import nn

from .fast_mit import use_attention


@MODELS.register_module()
class NVMixVisionTransformer(MixVisionTransformer):
    """MMSeg's ``MixVisionTransformer`` with NVlabs' LayerNorm eps values.

    Follows ``mmseg/models/backbones/mix_transformer.py`` of NVlabs/SegFormer.

    Args:
        patch_embed_norm_eps, sr_norm_eps (float): Eps of the
            patch-embedding norms and of the attention's spatial-reduction
            norms.
        norm_cfg (dict): The other norms, a LayerNorm.
        attention (str): ``'mmseg'`` (``nn.MultiheadAttention``) or
            ``'sdpa'`` (``scaled_dot_product_attention``, equal up to
            rounding, faster on a GPU). Default: ``'mmseg'``.
        token_maps (str): ``'copy'`` (MMSeg's copies of the tokens into a
            map for each convolution) or ``'view'`` (channels-last views,
            equal up to rounding). Default: ``'copy'``.
        **kwargs: The other arguments of ``MixVisionTransformer``.
    """

    def __init__(self,
                 patch_embed_norm_eps: float = 1e-5,
                 sr_norm_eps: float = 1e-5,
                 norm_cfg: dict = dict(type='LN', eps=1e-6),
                 attention: str = 'mmseg',
                 token_maps: str = 'copy',
                 **kwargs):
        super().__init__(norm_cfg=norm_cfg, **kwargs)
        use_attention(self, attention, token_maps)
        self.attention, self.token_maps = attention, token_maps
        self.patch_embed_norm_eps = patch_embed_norm_eps
        self.sr_norm_eps = sr_norm_eps
        for patch_embed, blocks, _ in self.layers:
            self._set_eps(patch_embed.norm, patch_embed_norm_eps)
            for block in blocks:
                if block.attn.sr_ratio > 1:
                    self._set_eps(block.attn.norm, sr_norm_eps)

    @staticmethod
    def _set_eps(norm: nn.Module, eps: float) -> None:
        # LayerNorm reads eps at every forward: MMSeg's module tree stays
        if not isinstance(norm, nn.LayerNorm):
            raise TypeError(f'NVMixVisionTransformer needs LayerNorm norms '
                            f'(norm_cfg type LN), got {type(norm).__name__}')
        norm.eps = float(eps)
