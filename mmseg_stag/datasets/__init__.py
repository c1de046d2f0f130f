from .acdc import CONTINUAL_META_KEYS, ACDCContinualDataset
from .acdc_layout import make_acdc_like_tree

__all__ = ['ACDCContinualDataset', 'CONTINUAL_META_KEYS',
           'make_acdc_like_tree']
