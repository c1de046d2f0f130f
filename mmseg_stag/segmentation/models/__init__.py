from . import stag_loss  # noqa: F401  (registers STAGLoss in MMSeg's MODELS)
from .adapted_segmentor import AdaptedEncoderDecoder, inference_config
from .fast_mit import SDPAMixVisionTransformer, use_attention
from .nvlabs_mit import NVMixVisionTransformer
from .nvlabs_segformer_head import NVSegformerHead

__all__ = [
    'AdaptedEncoderDecoder', 'inference_config', 'NVMixVisionTransformer',
    'NVSegformerHead', 'SDPAMixVisionTransformer', 'use_attention'
]
