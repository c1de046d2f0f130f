"""EcoTTA's meta networks, attached to a frozen network by forward hooks.

Follows EcoTTA's ecotta_sample_code.py (attach_meta_networks).
"""
import contextlib
import re
from typing import List, Sequence, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F


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
    """The meta network of one part, as hooks on its first and last block.

    Follows the notebook's build_meta_block and one_part_of_networks.

    Args:
        in_channels (int): Channels into the part.
        out_channels (int): Channels out of the part.
        stride (int): The part's stride.
    """

    def __init__(self, in_channels: int, out_channels: int, stride: int):
        super().__init__()
        self.meta_bn = nn.BatchNorm2d(out_channels)
        self.conv_block = ConvBlock(in_channels, out_channels, stride)
        self.regularising = False
        self.reg_loss = None
        self._adapted = None

    def before_part(self, block, args):
        """Detach the input if regularising; run the adapted branch."""
        x = args[0].detach() if self.regularising else args[0]
        # before the frozen blocks run: their in-place ops cannot touch x
        self._adapted = self.conv_block(x)
        return (x, ) + tuple(args[1:])

    def after_part(self, block, args, frozen_out):
        """Return ``meta_bn(out) + adapted``; record ``R_k`` if asked."""
        adapted, self._adapted = self._adapted, None
        out = self.meta_bn(frozen_out) + adapted
        if self.regularising:
            self.reg_loss = F.l1_loss(out, frozen_out.detach())
        return out


class MetaNetworks(nn.Module):
    """The K meta networks of a network (``<network>.ecotta``).

    Args:
        shapes (Sequence[tuple]): Per part ``(in, out, stride)``.
        parts (Sequence[int]): Blocks per part.
    """

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
        """Return ``sum_k R_k`` of the last forward inside ``regularising``.

        Raises:
            RuntimeError: If no regularised forward ran.
        """
        losses = [part.reg_loss for part in self.parts]
        if any(loss is None for loss in losses):
            raise RuntimeError('no regularised forward ran: forward inside '
                               'MetaNetworks.regularising()')
        return torch.stack(losses).sum()

    def extra_repr(self) -> str:
        return f'blocks_per_part={list(self.blocks_per_part)}'


def find_blocks(network: nn.Module, blocks: str) -> List[str]:
    """Return the names of the modules that ``blocks`` fully matches."""
    pattern = re.compile(blocks)
    return [n for n, _ in network.named_modules() if pattern.fullmatch(n)]


@torch.no_grad()
def trace_blocks(network: nn.Module, names: List[str],
                 input_size: Sequence[int]) -> List[Tuple[tuple, tuple]]:
    """Return each block's input and output shape on one zero image.

    Raises:
        ValueError: If the blocks do not form a chain, once each, in order.
    """
    modules = dict(network.named_modules())
    seen = []
    handles = [
        modules[n].register_forward_hook(
            lambda m, a, o, n=n: seen.append((n, a[0], o))) for n in names
    ]
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


def attach_meta_networks(network: nn.Module, blocks: str,
                         parts: Sequence[int],
                         input_size: Sequence[int] = (3, 32, 32)
                         ) -> MetaNetworks:
    """Attach ``len(parts)`` meta networks as ``network.ecotta``, in place.

    Args:
        network (nn.Module): The source network.
        blocks (str): Regex of the blocks' module names.
        parts (Sequence[int]): Consecutive blocks per part, covering all.
        input_size (Sequence[int]): One image's size. Default: (3, 32, 32).

    Returns:
        MetaNetworks: The attached meta networks.

    Raises:
        ValueError: If the parts do not cover the blocks or the blocks do
            not form a chain.
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
    modules = dict(network.named_modules())
    specs, spans, start = [], [], 0
    for size in parts:
        (c_in, h_in), (c_out, h_out) = (
            (shapes[start][0][1], shapes[start][0][2]),
            (shapes[start + size - 1][1][1], shapes[start + size - 1][1][2]))
        specs.append((c_in, c_out, h_in // h_out))
        spans.append((names[start], names[start + size - 1]))
        start += size
    param = next(network.parameters())
    meta = MetaNetworks(specs, parts).to(param.device, param.dtype)
    network.add_module('ecotta', meta)
    for part, (first, last) in zip(meta.parts, spans):
        modules[first].register_forward_pre_hook(part.before_part)
        modules[last].register_forward_hook(part.after_part)
    return meta
