"""Seeded training of the demo's small source models on clean images."""
import math
import time
from typing import Optional

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F


def to_tensor(images: np.ndarray) -> torch.Tensor:
    """uint8 ``[N, H, W, 3]`` -> float ``[N, 3, H, W]`` in ``[0, 1]`` (the
    arithmetic of the OnlineClassifier's data preprocessor)."""
    x = torch.from_numpy(np.array(images, dtype=np.uint8)).float().div_(255.0)
    return x.permute(0, 3, 1, 2).contiguous()


def random_shift(x: torch.Tensor, max_shift: int,
                 generator: torch.Generator) -> torch.Tensor:
    """Translate each image by up to ``max_shift`` pixels (zero padding)."""
    if max_shift <= 0:
        return x
    n, c, h, w = x.shape
    padded = F.pad(x, [max_shift] * 4)
    dx = torch.randint(0, 2 * max_shift + 1, (n, ), generator=generator)
    dy = torch.randint(0, 2 * max_shift + 1, (n, ), generator=generator)
    rows = (dy[:, None] + torch.arange(h)[None])[:, None, :, None]
    cols = (dx[:, None] + torch.arange(w)[None])[:, None, None, :]
    return padded[torch.arange(n)[:, None, None, None],
                  torch.arange(c)[None, :, None, None], rows, cols]


def photometric_jitter(x: torch.Tensor, strength: float,
                       generator: torch.Generator) -> torch.Tensor:
    """Light robustness augmentation (in the spirit of the AugMix source
    model of the CIFAR-100-C benchmark, none of the test corruptions):
    blend each image towards a random grey level (contrast/brightness) and
    add weak Gaussian noise to half of them.

    Args:
        x: ``[N, 3, H, W]`` in ``[0, 1]``.
        strength: 0 disables; 1 blends up to 60 % and adds noise up to
            sigma 0.08.
    """
    if strength <= 0:
        return x
    n = x.shape[0]
    rand = torch.rand(n, 4, generator=generator)
    keep = 1.0 - 0.6 * strength * rand[:, 0]
    grey = rand[:, 1]
    x = x * keep.view(n, 1, 1, 1) + (1 - keep).view(n, 1, 1, 1) * \
        grey.view(n, 1, 1, 1)
    sigma = 0.08 * strength * rand[:, 2] * (rand[:, 3] < 0.5)
    noise = torch.randn(x.shape, generator=generator)
    return (x + sigma.view(n, 1, 1, 1) * noise).clamp_(0, 1)


@torch.no_grad()
def evaluate(model: nn.Module, images: np.ndarray, labels: np.ndarray,
             batch_size: int = 256) -> float:
    """Accuracy (%) of ``model`` in eval mode on uint8 HWC images."""
    model.eval()
    correct = 0
    for i in range(0, len(images), batch_size):
        x = to_tensor(images[i:i + batch_size])
        correct += int((model(x).argmax(1).numpy() ==
                        labels[i:i + batch_size]).sum())
    return 100.0 * correct / len(images)


def train_classifier(model: nn.Module,
                     images: np.ndarray,
                     labels: np.ndarray,
                     epochs: int = 6,
                     batch_size: int = 64,
                     lr: float = 3e-3,
                     weight_decay: float = 1e-4,
                     max_shift: int = 2,
                     jitter: float = 1.0,
                     seed: int = 0,
                     log: Optional[callable] = print) -> nn.Module:
    """Train with AdamW, cosine decay and random shifts; seeded.

    Args:
        model: the network (trained in place).
        images: uint8 ``[N, H, W, 3]``; labels: ``[N]``.
        epochs, batch_size, lr, weight_decay: optimisation.
        max_shift: random translation augmentation (pixels).
        jitter: strength of :func:`photometric_jitter` (0: off).
        seed: seeds the shuffles, augmentation and dropout.
    """
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    x_all = to_tensor(images)
    y_all = torch.from_numpy(labels)
    opt = torch.optim.AdamW(model.parameters(), lr=lr,
                            weight_decay=weight_decay)
    steps = epochs * math.ceil(len(images) / batch_size)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: 0.5 * (1 + math.cos(math.pi * s / steps)))
    t0 = time.time()
    for epoch in range(epochs):
        model.train()
        perm = torch.randperm(len(images), generator=gen)
        total = 0.0
        for i in range(0, len(images), batch_size):
            idx = perm[i:i + batch_size]
            x = random_shift(x_all[idx], max_shift, gen)
            x = photometric_jitter(x, jitter, gen)
            loss = F.cross_entropy(model(x), y_all[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            total += loss.item() * len(idx)
        if log:
            log(f'    epoch {epoch + 1}/{epochs}: loss '
                f'{total / len(images):.4f} ({time.time() - t0:.0f} s)')
    return model.eval()
