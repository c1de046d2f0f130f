"""WideResNet for CIFAR with RobustBench's parameter names, as RobustBench's
``robustbench/model_zoo/architectures/wide_resnet.py``."""
import math
from typing import Optional, Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F

from .registry import CLS_MODELS


class BasicBlock(nn.Module):
    """Pre-activation residual unit ``BN-ReLU-conv3x3-BN-ReLU-conv3x3``;
    ``stride`` is the first convolution's and the shortcut's."""

    def __init__(self, in_planes: int, out_planes: int, stride: int):
        super().__init__()
        self.bn1 = nn.BatchNorm2d(in_planes)
        self.relu1 = nn.ReLU(inplace=True)
        self.conv1 = nn.Conv2d(in_planes, out_planes, 3, stride, 1,
                               bias=False)
        self.bn2 = nn.BatchNorm2d(out_planes)
        self.relu2 = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(out_planes, out_planes, 3, 1, 1, bias=False)
        self.equal_in_out = in_planes == out_planes
        self.convShortcut = None if self.equal_in_out else nn.Conv2d(
            in_planes, out_planes, 1, stride, 0, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pre = self.relu1(self.bn1(x))
        # width-changing units project the pre-activated input
        shortcut = x if self.equal_in_out else self.convShortcut(pre)
        out = self.relu2(self.bn2(self.conv1(pre)))
        return shortcut + self.conv2(out)


class NetworkBlock(nn.Module):
    """A stack of ``num_layers`` units; the first changes width and stride."""

    def __init__(self, num_layers: int, in_planes: int, out_planes: int,
                 stride: int):
        super().__init__()
        self.layer = nn.Sequential(*[
            BasicBlock(in_planes if i == 0 else out_planes, out_planes,
                       stride if i == 0 else 1)
            for i in range(num_layers)
        ])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer(x)


@CLS_MODELS.register_module()
class WideResNet(nn.Module):
    """WRN-``depth``-``widen_factor`` (``depth = 6n + 4``) for 32x32 inputs,
    normalised by ``input_mean``/``input_std`` (non-persistent) if given."""

    def __init__(self,
                 depth: int = 28,
                 widen_factor: int = 10,
                 num_classes: int = 10,
                 input_mean: Optional[Sequence[float]] = None,
                 input_std: Optional[Sequence[float]] = None):
        super().__init__()
        if (depth - 4) % 6:
            raise ValueError(f'WideResNet depth must be 6n + 4, got {depth}')
        n = (depth - 4) // 6
        widths = [16, 16 * widen_factor, 32 * widen_factor,
                  64 * widen_factor]
        self.conv1 = nn.Conv2d(3, widths[0], 3, 1, 1, bias=False)
        self.block1 = NetworkBlock(n, widths[0], widths[1], 1)
        self.block2 = NetworkBlock(n, widths[1], widths[2], 2)
        self.block3 = NetworkBlock(n, widths[2], widths[3], 2)
        self.bn1 = nn.BatchNorm2d(widths[3])
        self.relu = nn.ReLU(inplace=True)
        self.fc = nn.Linear(widths[3], num_classes)
        self.nChannels = widths[3]
        self.normalize_input = input_mean is not None or input_std is not None
        if self.normalize_input:
            mean = torch.tensor(input_mean or (0., 0., 0.)).view(1, 3, 1, 1)
            std = torch.tensor(input_std or (1., 1., 1.)).view(1, 3, 1, 1)
            self.register_buffer('mu', mean, persistent=False)
            self.register_buffer('sigma', std, persistent=False)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                fan_out = m.kernel_size[0] * m.kernel_size[1] * m.out_channels
                nn.init.normal_(m.weight, 0.0, math.sqrt(2.0 / fan_out))
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)
            elif isinstance(m, nn.Linear):
                nn.init.zeros_(m.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.normalize_input:
            x = (x - self.mu) / self.sigma
        out = self.block3(self.block2(self.block1(self.conv1(x))))
        out = self.relu(self.bn1(out))
        out = F.adaptive_avg_pool2d(out, 1).flatten(1)
        return self.fc(out)


@CLS_MODELS.register_module(name='WRN28_10_Standard')
def wrn28_10_standard(**kwargs) -> WideResNet:
    """RobustBench ``Standard`` (CIFAR-10): WRN-28-10, ``[0, 1]`` inputs."""
    return WideResNet(depth=28, widen_factor=10, num_classes=10, **kwargs)


@CLS_MODELS.register_module(name='WRN40_2_AugMix')
def wrn40_2_augmix(**kwargs) -> WideResNet:
    """RobustBench ``Hendrycks2020AugMix_WRN`` (CIFAR-100): WRN-40-2."""
    return WideResNet(depth=40, widen_factor=2, num_classes=100,
                      input_mean=(0.5, 0.5, 0.5), input_std=(0.5, 0.5, 0.5),
                      **kwargs)
