"""Fixtures of the device tests: a tiny three-corruption CIFAR-C stream and
a tiny BatchNorm CNN checkpoint (the segmentation fixtures, ``tiny_acdc``
and ``confident_checkpoint``, come from ``tests/conftest.py``)."""
import os

import numpy as np
import pytest
import torch
import torch.nn as nn
from cuda_runs import CIFAR_NAMES


@pytest.fixture(scope='session')
def cifar_stream(tmp_path_factory):
    """The root of three corruptions of 16 32x32 images in the CIFAR-C
    layout; the class is visible in the mean intensity."""
    n = 16
    root = str(tmp_path_factory.mktemp('cifar-c'))
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 4, n)
    np.save(os.path.join(root, 'labels.npy'), np.tile(labels, 5))
    for k, name in enumerate(CIFAR_NAMES):
        base = (labels[:, None, None, None] * 50 + 30).astype(np.float64)
        noise = rng.normal(0, 20 + 20 * k, (5 * n, 32, 32, 3))
        images = np.clip(np.tile(base, (5, 32, 32, 3)) + noise, 0, 255)
        np.save(os.path.join(root, f'{name}.npy'), images.astype(np.uint8))
    return root


@pytest.fixture(scope='session')
def cnn_checkpoint(tmp_path_factory):
    """A seeded 4-class SmallCNN whose BatchNorm statistics are not the
    identity, as a plain checkpoint."""
    from mmseg_stag.classification import SmallCNN
    torch.manual_seed(0)
    model = SmallCNN(num_classes=4, width=4, norm='BN')
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.uniform_(-0.2, 0.2)
            m.running_var.uniform_(0.5, 1.5)
    path = tmp_path_factory.mktemp('cnn') / 'tiny_cnn.pth'
    torch.save({'state_dict': model.state_dict(), 'meta': {}}, path)
    return str(path)
