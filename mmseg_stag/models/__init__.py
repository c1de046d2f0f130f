from .nvlabs_convert import convert_nvlabs_checkpoint, convert_nvlabs_segformer
from .nvlabs_segformer_head import NVSegformerHead
from .tta_segmentor import TTAEncoderDecoder

__all__ = [
    'TTAEncoderDecoder', 'NVSegformerHead', 'convert_nvlabs_segformer',
    'convert_nvlabs_checkpoint'
]
