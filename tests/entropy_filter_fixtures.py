"""Shared fixtures of the EATA and SAR tests: a tiny float64 network whose
classifier (``model[3]``) is confident enough for the 0.4 ln C entropy
filter, and seeded input batches."""
import math

import torch
import torch.nn as nn

from mmseg_stag.classification.forward import make_forward

C = 5
E0 = 0.4 * math.log(C)
LR = 0.05  # large, so that a wrong update is visible
OPT = dict(type='SGD', lr=LR, momentum=0.9)
FORWARD = make_forward('3')


def make_model(seed=2, norm='ln'):
    torch.manual_seed(seed)
    norm_layer = nn.LayerNorm(8) if norm == 'ln' else nn.BatchNorm1d(8)
    model = nn.Sequential(nn.Linear(6, 8), norm_layer, nn.ReLU(),
                          nn.Linear(8, C))
    with torch.no_grad():
        model[3].weight.mul_(6.0)  # confident enough for E0 = 0.4 ln C
        model[1].weight.uniform_(0.5, 1.5)
        model[1].bias.uniform_(-0.3, 0.3)
    return model.double().eval()


def batch(seed, n=16):
    return torch.randn(n, 6, dtype=torch.float64,
                       generator=torch.Generator().manual_seed(seed))
