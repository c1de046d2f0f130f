from .nvlabs_convert import convert_nvlabs_checkpoint, convert_nvlabs_segformer
from .nvlabs_segformer_head import NVSegformerHead

__all__ = [
    'NVSegformerHead', 'convert_nvlabs_segformer', 'convert_nvlabs_checkpoint'
]
