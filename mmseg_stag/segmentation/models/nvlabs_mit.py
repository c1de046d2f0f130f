"""MMSeg's MiT with the LayerNorm eps values of NVlabs' release."""
from mmseg.models.backbones import MixVisionTransformer
from mmseg.registry import MODELS
from torch import nn


@MODELS.register_module()
class NVMixVisionTransformer(MixVisionTransformer):
    """MMSeg's ``MixVisionTransformer`` with NVlabs' LayerNorm eps values.

    NVlabs' MiT (``mmseg/models/backbones/mix_transformer.py`` of
    NVlabs/SegFormer) builds the patch-embedding norms
    (``OverlapPatchEmbed.norm``) and the spatial-reduction norms of the
    attention (``Attention.norm``) as plain ``nn.LayerNorm``, i.e. eps 1e-5,
    and every other norm (block ``norm1``/``norm2``, stage ``norm1..4``)
    with ``partial(nn.LayerNorm, eps=1e-6)``. MMSeg's MiT uses
    ``norm_cfg``'s eps (1e-6) everywhere. This subclass sets the two kinds
    of norms that differ, so that a checkpoint converted by
    ``tools/convert_nvlabs_segformer.py`` computes what NVlabs' model
    computes. Parameters and their names are MMSeg's.

    Args:
        patch_embed_norm_eps (float): eps of the patch-embedding norms
            (``layers.{i}.0.norm``). Default: 1e-5 (NVlabs).
        sr_norm_eps (float): eps of the attention's spatial-reduction norms
            (``layers.{i}.1.{j}.attn.norm``, stages with ``sr_ratio > 1``).
            Default: 1e-5 (NVlabs).
        norm_cfg (dict): The other norms, as in MMSeg (must be a LayerNorm).
            Default: ``dict(type='LN', eps=1e-6)`` (NVlabs' ``mit_b*``).
        **kwargs: The other arguments of ``MixVisionTransformer``.
    """

    def __init__(self,
                 patch_embed_norm_eps: float = 1e-5,
                 sr_norm_eps: float = 1e-5,
                 norm_cfg: dict = dict(type='LN', eps=1e-6),
                 **kwargs):
        super().__init__(norm_cfg=norm_cfg, **kwargs)
        self.patch_embed_norm_eps = patch_embed_norm_eps
        self.sr_norm_eps = sr_norm_eps
        for patch_embed, blocks, _ in self.layers:
            self._set_eps(patch_embed.norm, patch_embed_norm_eps)
            for block in blocks:
                if block.attn.sr_ratio > 1:
                    self._set_eps(block.attn.norm, sr_norm_eps)

    @staticmethod
    def _set_eps(norm: nn.Module, eps: float) -> None:
        # nn.LayerNorm reads ``eps`` at every forward, so setting it after
        # construction is enough and keeps MMSeg's module tree untouched
        if not isinstance(norm, nn.LayerNorm):
            raise TypeError(f'NVMixVisionTransformer needs LayerNorm norms '
                            f'(norm_cfg type LN), got {type(norm).__name__}')
        norm.eps = float(eps)
