"""EcoTTA's meta networks joined into a frozen classification network as
modules, and their presets; follows EcoTTA's ecotta_sample_code.py."""
import contextlib
import re
from typing import List, Optional, Sequence, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F

from .registry import CLS_MODELS


class ConvBlock(nn.Module):
    """conv3x3 (no bias) -> BN -> ReLU (the notebook's ``conv_block``)."""

    def __init__(self, in_channels: int, out_channels: int, stride: int):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, 3, stride, 1,
                              bias=False)
        self.bn = nn.BatchNorm2d(out_channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.bn(self.conv(x)))


class MetaPart(nn.Module):
    """The meta network of one part: ``meta_bn(out) + conv_block(in)``
    (the notebook's build_meta_block and one_part_of_networks)."""

    def __init__(self, in_channels: int, out_channels: int, stride: int):
        super().__init__()
        self.meta_bn = nn.BatchNorm2d(out_channels)
        self.conv_block = ConvBlock(in_channels, out_channels, stride)
        self.regularising, self.reg_loss, self._adapted = False, None, None


class MetaNetworks(nn.Module):
    """The K meta networks of a network (``<network>.ecotta``), from per
    part ``(in, out, stride)`` and blocks per part."""

    def __init__(self, shapes: Sequence[Tuple[int, int, int]],
                 parts: Sequence[int]):
        super().__init__()
        self.parts = nn.ModuleList(MetaPart(*s) for s in shapes)
        self.blocks_per_part = tuple(int(p) for p in parts)

    @contextlib.contextmanager
    def regularising(self):
        """Compute each part's ``R_k`` on detached inputs inside."""
        for part in self.parts:
            part.regularising, part.reg_loss = True, None
        try:
            yield self
        finally:
            for part in self.parts:  # drop the graph: stays deep-copyable
                part.regularising, part.reg_loss = False, None

    def regulariser(self) -> torch.Tensor:
        """Return ``sum_k R_k`` of the last forward inside ``regularising``
        (a RuntimeError if none ran)."""
        losses = [part.reg_loss for part in self.parts]
        if any(loss is None for loss in losses):
            raise RuntimeError('no regularised forward ran: forward inside '
                               'MetaNetworks.regularising()')
        return torch.stack(losses).sum()

    def extra_repr(self) -> str:
        return f'blocks_per_part={list(self.blocks_per_part)}'


class MetaEntry(nn.Module):
    """Where meta network ``k`` joins, before its part's first block; it
    holds no tensor (the part is ``ecotta.parts.k``)."""

    def __init__(self, part: MetaPart, index: int):
        super().__init__()
        object.__setattr__(self, 'part', part)  # one owner: ecotta.parts
        self.index = index

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Run the part's conv block on its input (detached if
        regularising); return what the frozen blocks get."""
        part = self.part
        x = x.detach() if part.regularising else x
        # before the frozen blocks run: their in-place ops cannot touch x
        part._adapted = part.conv_block(x)
        return x

    def extra_repr(self) -> str:
        return f'ecotta.parts.{self.index}: conv_block from here'


class MetaExit(MetaEntry):
    """Where meta network ``k`` leaves, after its part's last block."""

    def forward(self, frozen_out: torch.Tensor) -> torch.Tensor:
        """Return ``meta_bn(out) + adapted``; record ``R_k`` if
        regularising."""
        part = self.part
        adapted, part._adapted = part._adapted, None
        out = part.meta_bn(frozen_out) + adapted
        if part.regularising:
            part.reg_loss = F.l1_loss(out, frozen_out.detach())
        return out

    def extra_repr(self) -> str:
        return f'ecotta.parts.{self.index}: meta_bn(out) + conv_block'


def find_blocks(network: nn.Module, blocks: str) -> List[str]:
    """Return the names of the modules that ``blocks`` fully matches."""
    pattern = re.compile(blocks)
    return [n for n, _ in network.named_modules() if pattern.fullmatch(n)]


@torch.no_grad()
def trace_blocks(network: nn.Module, names: List[str],
                 input_size: Sequence[int]) -> List[Tuple[tuple, tuple]]:
    """Return each block's input and output shape on one zero image; a
    ValueError unless the blocks form a chain, once each, in order."""
    seen = []
    handles = [network.get_submodule(n).register_forward_hook(
        lambda m, a, o, n=n: seen.append((n, a[0], o))) for n in names]
    was_training = network.training
    try:
        network.eval()  # leave the running statistics alone
        param = next(network.parameters())
        network(param.new_zeros(1, *input_size))
    finally:
        network.train(was_training)
        for h in handles:
            h.remove()
    if [n for n, _, _ in seen] != names:
        raise ValueError(f'EcoTTA blocks {names} do not run once each, in '
                         f'this order: ran {[n for n, _, _ in seen]}')
    for (prev, _, out), (name, inp, _) in zip(seen, seen[1:]):
        if inp is not out:
            raise ValueError(f'EcoTTA blocks must follow each other: the '
                             f'input of {name} is not the output of {prev}')
    return [(tuple(i.shape), tuple(o.shape)) for _, i, o in seen]


def sequential_parent(network: nn.Module, name: str
                      ) -> Tuple[nn.Sequential, str]:
    """The ``nn.Sequential`` holding block ``name``, and its key there (a
    ValueError if the parent is no ``nn.Sequential``)."""
    parent_name, _, child = name.rpartition('.')
    parent = network.get_submodule(parent_name)
    if not isinstance(parent, nn.Sequential):
        raise ValueError(
            f'EcoTTA joins its meta networks inside nn.Sequential '
            f'containers: the parent of block {name!r} is a '
            f'{type(parent).__name__} ({parent_name or "the network"}); '
            'choose blocks= that are items of an nn.Sequential')
    return parent, child


def insert_beside(network: nn.Module, name: str, module: nn.Module,
                  module_name: str, after: bool) -> None:
    """Put ``module`` as ``module_name`` before (after) the block ``name``
    in its ``nn.Sequential``; the blocks keep their names (and keys)."""
    parent, child = sequential_parent(network, name)
    items = list(parent.named_children())
    items.insert([n for n, _ in items].index(child) + after,
                 (module_name, module))
    # nn.Sequential.insert renumbers its items; removing them and adding
    # them back in the new order keeps each name
    for item_name, _ in list(parent.named_children()):
        delattr(parent, item_name)
    for item_name, item in items:
        parent.add_module(item_name, item)


def attach_meta_networks(network: nn.Module, blocks: str,
                         parts: Sequence[int],
                         input_size: Sequence[int] = (3, 32, 32)
                         ) -> MetaNetworks:
    """Attach ``len(parts)`` meta networks as ``network.ecotta``, in place:
    part ``k``'s ``MetaEntry`` before its first block (``ecotta_in{k}``),
    its ``MetaExit`` after its last (``ecotta_out{k}``).

    Args:
        blocks (str): Regex of the blocks' module names.
        parts (Sequence[int]): Consecutive blocks per part, covering all.
        input_size (Sequence[int]): One image's size.

    Raises:
        ValueError: If the parts do not cover the blocks, the blocks do
            not form a chain or are not items of an ``nn.Sequential``.
    """
    if hasattr(network, 'ecotta'):
        raise ValueError('the network already has EcoTTA meta networks')
    names = find_blocks(network, blocks)
    parts = [int(p) for p in parts]
    if not names:
        raise ValueError(f'EcoTTA blocks={blocks!r} matches no module of '
                         f'{type(network).__name__}')
    if any(p < 1 for p in parts) or sum(parts) != len(names):
        raise ValueError(
            f'EcoTTA parts={parts} must cover the {len(names)} blocks that '
            f'blocks={blocks!r} matches ({names[0]} ... {names[-1]}) with '
            f'parts of >= 1 block, but they cover {sum(parts)}')
    shapes = trace_blocks(network, names, input_size)
    specs, spans, start = [], [], 0
    for size in parts:
        c_in, h_in = shapes[start][0][1:3]
        c_out, h_out = shapes[start + size - 1][1][1:3]
        specs.append((c_in, c_out, h_in // h_out))
        spans.append((names[start], names[start + size - 1]))
        start += size
    for name in (n for span in spans for n in span):  # all checked first
        sequential_parent(network, name)
    param = next(network.parameters())
    meta = MetaNetworks(specs, parts).to(param.device, param.dtype)
    for k, (part, (first, last)) in enumerate(zip(meta.parts, spans)):
        insert_beside(network, first, MetaEntry(part, k), f'ecotta_in{k}',
                      after=False)
        insert_beside(network, last, MetaExit(part, k), f'ecotta_out{k}',
                      after=True)
    network.add_module('ecotta', meta)
    return meta


#: the WideResNets' residual blocks (RobustBench names) and blocks per
#: part, by number of blocks and K (docs/classification.md)
WRN_PRESET = (r'block\d\.layer\.\d+',
              {18: {4: [3, 3, 6, 6], 5: [3, 3, 3, 3, 6]},
               12: {4: [2, 2, 4, 4], 5: [2, 2, 2, 2, 4]}})

#: ``network type -> (blocks regex, {number of blocks: {K: parts}})``; the
#: demo CNN has 12 modules, one conv-norm-ReLU layer per part at K=4
ECOTTA_PRESETS = {
    'WideResNet': WRN_PRESET, 'WRN28_10_Standard': WRN_PRESET,
    'WRN40_2_AugMix': WRN_PRESET,
    'SmallCNN': (r'features\.\d+', {12: {4: [3, 3, 3, 3], 2: [6, 6]}}),
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
        blocks (str, optional): Regex of the blocks' names (the preset's).
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
