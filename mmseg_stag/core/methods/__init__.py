"""The online-adaptation methods, in ``METHODS`` by lower-case name."""
from .base import BaseMethod
from .bn_adapt import BNAdapt
from .cotta import CoTTA
from .deyo import DeYO
from .eata import EATA
from .ecotta import EcoTTA
from .sample_filtering import SampleFilteringMethod
from .sar import SAR
from .source import Source
from .tent import TENT

__all__ = [
    'BaseMethod', 'SampleFilteringMethod', 'Source',
    'BNAdapt', 'TENT', 'EATA', 'SAR', 'DeYO', 'CoTTA', 'EcoTTA'
]
