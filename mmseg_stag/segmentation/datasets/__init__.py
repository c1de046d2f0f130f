from .acdc import CONTINUAL_META_KEYS, STREAM_TAGS, ACDCContinualDataset

__all__ = ['ACDCContinualDataset', 'CONTINUAL_META_KEYS', 'STREAM_TAGS']
