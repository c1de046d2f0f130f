"""The tests' tiny per-pixel network of plain PyTorch (a BatchNorm and a
GroupNorm, a 1x1 classifier), one definition for the method tests."""
import torch.nn as nn


class TinySegNet(nn.Module):
    """conv -> BN -> conv -> GN -> 1x1 classifier, with a forward counter."""

    def __init__(self, num_classes=5, dim=8):
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(3, dim, 3, padding=1), nn.BatchNorm2d(dim), nn.ReLU(),
            nn.Conv2d(dim, dim, 3, padding=1), nn.GroupNorm(2, dim),
            nn.ReLU())
        self.classifier = nn.Conv2d(dim, num_classes, 1)
        self.forwards = 0

    def forward(self, x):
        self.forwards += 1
        return self.classifier(self.body(x))
