"""A classification network with EcoTTA's meta networks, and its presets."""
from typing import Optional, Sequence

import torch.nn as nn

from mmseg_stag.core.methods.ecotta_networks import (attach_meta_networks,
                                                     find_blocks)
from .registry import CLS_MODELS

#: the WideResNets' residual blocks (RobustBench names)
WRN_BLOCKS = r'block\d\.layer\.\d+'
#: blocks per part, by number of blocks and K (docs/classification.md)
WRN_PARTS = {18: {4: [3, 3, 6, 6], 5: [3, 3, 3, 3, 6]},
             12: {4: [2, 2, 4, 4], 5: [2, 2, 2, 2, 4]}}
#: the demo CNN's 12 modules, one conv-norm-ReLU layer per part at K=4
SMALL_CNN_BLOCKS = r'features\.\d+'
SMALL_CNN_PARTS = {12: {4: [3, 3, 3, 3], 2: [6, 6]}}

#: ``network type -> (blocks regex, {number of blocks: {K: parts}})``
ECOTTA_PRESETS = {
    'WideResNet': (WRN_BLOCKS, WRN_PARTS),
    'WRN28_10_Standard': (WRN_BLOCKS, WRN_PARTS),
    'WRN40_2_AugMix': (WRN_BLOCKS, WRN_PARTS),
    'SmallCNN': (SMALL_CNN_BLOCKS, SMALL_CNN_PARTS),
}


def preset_partition(network_type: str, num_blocks: int, K: int):
    """Return the preset blocks per part for ``K`` parts of a network."""
    presets = ECOTTA_PRESETS.get(network_type, (None, {}))[1].get(
        num_blocks, {})
    if K not in presets:
        raise ValueError(
            f'EcoTTANetwork: no K={K} preset for {network_type} with '
            f'{num_blocks} blocks (presets: {sorted(presets) or "none"}); '
            'give parts=[blocks per part] instead')
    return presets[K]


@CLS_MODELS.register_module(name='EcoTTANetwork')
def ecotta_network(network: dict,
                   K: Optional[int] = None,
                   parts: Optional[Sequence[int]] = None,
                   blocks: Optional[str] = None,
                   input_size: Sequence[int] = (3, 32, 32),
                   allow_cold_start: bool = False) -> nn.Module:
    """Build ``network`` and attach EcoTTA's meta networks as ``.ecotta``.

    Args:
        network (dict): The source network's ``CLS_MODELS`` config.
        K (int, optional): Number of parts, from :data:`ECOTTA_PRESETS`.
        parts (Sequence[int], optional): Blocks per part, instead of ``K``.
        blocks (str, optional): Regex of the blocks' names.
            Default: the preset's.
        input_size (Sequence[int]): ``(C, H, W)`` of one input.
        allow_cold_start (bool): Whether weights without meta networks may
            load.
    """
    net_type = network.get('type')
    if blocks is None:
        if net_type not in ECOTTA_PRESETS:
            raise ValueError(
                f'EcoTTANetwork: no preset for network type {net_type!r} '
                f'(presets: {sorted(ECOTTA_PRESETS)}); give blocks=<regex '
                'of the block names> and parts=[blocks per part]')
        blocks = ECOTTA_PRESETS[net_type][0]
    if (K is None) == (parts is None):
        raise ValueError('EcoTTANetwork: give either K (a preset) or parts, '
                         f'got K={K!r}, parts={parts!r}')
    model = CLS_MODELS.build(dict(network))
    if parts is None:
        parts = preset_partition(net_type, len(find_blocks(model, blocks)),
                                 int(K))
    meta = attach_meta_networks(model, blocks, parts, input_size)
    meta.allow_cold_start = bool(allow_cold_start)
    return model
