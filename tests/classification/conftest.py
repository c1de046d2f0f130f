"""Shared fixtures of the classification tests: a tiny three-corruption
stream in the CIFAR-C layout, a tiny BatchNorm CNN and its checkpoint. The
plain helpers (the configs shrunk to them, the kill hook's config, the
comparison of two runs) live in ``tests/cls_helpers.py``."""
import os
import os.path as osp

import numpy as np
import pytest
import torch
import torch.nn as nn

from mmseg_stag.classification import (SmallCNN, StreamData,
                                       build_corruption_sets)

NAMES = ('gaussian_noise', 'shot_noise', 'impulse_noise')


@pytest.fixture
def names():
    """The corruptions of the ``stream`` fixture, in file order."""
    return NAMES


@pytest.fixture
def stream(tmp_path):
    """``(StreamData, root)``: three corruptions of 40 32x32 images; the
    class is visible in the mean intensity so that a model can be good or
    bad."""
    n = 40
    root = str(tmp_path / 'cifar-c')
    os.makedirs(root, exist_ok=True)
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 4, n)
    np.save(osp.join(root, 'labels.npy'), np.tile(labels, 5))
    for k, c in enumerate(NAMES):
        base = (labels[:, None, None, None] * 50 + 30).astype(np.float64)
        noise = rng.normal(0, 20 + 20 * k, (5 * n, 32, 32, 3))
        arr = np.clip(np.tile(base, (5, 32, 32, 3)) + noise, 0, 255)
        np.save(osp.join(root, f'{c}.npy'), arr.astype(np.uint8))
    sets = build_corruption_sets(dict(type='CIFARC', data_root=root,
                                      corruptions=list(NAMES)))
    return StreamData(sets), root


def _tiny_model(seed=0):
    torch.manual_seed(seed)
    model = SmallCNN(num_classes=4, width=4, norm='BN')
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.uniform_(-0.2, 0.2)
            m.running_var.uniform_(0.5, 1.5)
    return model.eval()


@pytest.fixture
def tiny_model():
    """``tiny_model(seed=0)``: a seeded 4-class SmallCNN (BatchNorm with
    running statistics that are not the identity), in eval mode; its
    classifier is ``fc``."""
    return _tiny_model


@pytest.fixture
def checkpoint(tmp_path, tiny_model):
    """A file of ``tiny_model()``'s weights (``{'state_dict', 'meta'}``)."""
    path = str(tmp_path / 'tiny.pth')
    torch.save({'state_dict': tiny_model().state_dict(), 'meta': {}}, path)
    return path
