"""EcoTTA's meta networks on a frozen network (Song et al., CVPR 2023).

The authors' notebook (``Lily-Le/EcoTTA`` at ``d72f0ce``,
``ecotta_sample_code.py``: ``conv_block``, ``build_meta_block``,
``one_part_of_networks``, ``attach_meta_networks``) splits the encoder after
its input convolution into K parts of consecutive residual blocks and gives
each part a meta network; the part's output becomes
``meta_bn(part(x)) + conv_block(x)``. Here the parts are attached with
forward hooks on the network's own blocks, so the network keeps its module
names (its source weights load as they are) and the meta networks sit under
``<network>.ecotta``.
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
    """The meta network of one part (``build_meta_block``) and the part's
    forward (``one_part_of_networks``), as hooks on the part's first and last
    block.

    ``regularising``: the part's input is detached (so ``R_k`` trains only
    this meta network) and ``reg_loss`` is the L1 distance of the part's
    output to the frozen part's output (detached): ``R_k``.
    """

    def __init__(self, in_channels: int, out_channels: int, stride: int):
        super().__init__()
        self.meta_bn = nn.BatchNorm2d(out_channels)
        self.conv_block = ConvBlock(in_channels, out_channels, stride)
        self.regularising = False
        self.reg_loss = None
        self._adapted = None

    def before_part(self, block, args):
        """Forward pre-hook of the part's first block."""
        x = args[0].detach() if self.regularising else args[0]
        # computed before the frozen blocks run: an in-place op there cannot
        # touch the input it reads
        self._adapted = self.conv_block(x)
        return (x, ) + tuple(args[1:])

    def after_part(self, block, args, frozen_out):
        """Forward hook of the part's last block."""
        adapted, self._adapted = self._adapted, None
        out = self.meta_bn(frozen_out) + adapted
        if self.regularising:
            self.reg_loss = F.l1_loss(out, frozen_out.detach())
        return out


class MetaNetworks(nn.Module):
    """The K meta networks of a network (``<network>.ecotta``).

    Args:
        shapes: per part ``(in_channels, out_channels, stride)``.
        parts: blocks per part (kept for ``repr`` and checks).
    """

    def __init__(self, shapes: Sequence[Tuple[int, int, int]],
                 parts: Sequence[int]):
        super().__init__()
        self.parts = nn.ModuleList(MetaPart(*s) for s in shapes)
        self.blocks_per_part = tuple(int(p) for p in parts)

    @contextlib.contextmanager
    def regularising(self):
        """Forwards inside compute each part's ``R_k`` on detached inputs
        (read them inside, with :meth:`regulariser`)."""
        for part in self.parts:
            part.regularising, part.reg_loss = True, None
        try:
            yield self
        finally:
            for part in self.parts:  # no graph kept (a module stays copyable)
                part.regularising, part.reg_loss = False, None

    def regulariser(self) -> torch.Tensor:
        """``sum_k R_k`` of the last forward inside :meth:`regularising`."""
        losses = [part.reg_loss for part in self.parts]
        if any(loss is None for loss in losses):
            raise RuntimeError('no regularised forward ran: forward inside '
                               'MetaNetworks.regularising()')
        return torch.stack(losses).sum()

    def extra_repr(self) -> str:
        return f'blocks_per_part={list(self.blocks_per_part)}'


def find_blocks(network: nn.Module, blocks: str) -> List[str]:
    """Names of the modules whose whole name matches ``blocks``, in the
    network's module order."""
    pattern = re.compile(blocks)
    return [n for n, _ in network.named_modules() if pattern.fullmatch(n)]


@torch.no_grad()
def trace_blocks(network: nn.Module, names: List[str],
                 input_size: Sequence[int]) -> List[Tuple[tuple, tuple]]:
    """Each block's input and output shape on one zero image; raises a
    ValueError unless every block's input is the previous block's output
    (a chain: parts of consecutive blocks can be hooked)."""
    modules = dict(network.named_modules())
    seen = []
    handles = [
        modules[n].register_forward_hook(
            lambda m, a, o, n=n: seen.append((n, a[0], o))) for n in names
    ]
    was_training = network.training
    try:
        network.eval()  # no running statistic changes
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
    """Attach K = ``len(parts)`` meta networks to ``network`` (in place,
    as ``network.ecotta``).

    Args:
        network: the source network.
        blocks: regex of the blocks' module names, e.g.
            ``r'block\\d\\.layer\\.\\d+'`` (a WideResNet's residual blocks).
        parts: consecutive blocks per part, covering every block
            (notebook's ``num_blocks``; WRN-40-2 K=4: ``[3, 3, 6, 6]``).
        input_size: ``(C, H, W)`` of one image, to read the parts' shapes.

    Raises:
        ValueError: the partition does not cover the blocks, or the blocks
            do not form a chain.
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
