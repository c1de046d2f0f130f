"""Write small datasets in ACDC's on-disk layout (tests, quick checks)."""
import os
import os.path as osp
from typing import Sequence, Tuple

import numpy as np
from PIL import Image


def acdc_paths(root: str, condition: str, split: str, sequence: str,
               frame: int) -> Tuple[str, str]:
    """Image and label path of one ACDC frame."""
    name = f'{sequence}_frame_{frame:06d}'
    img = osp.join(root, 'rgb_anon', condition, split, sequence,
                   f'{name}_rgb_anon.png')
    gt = osp.join(root, 'gt', condition, split, sequence,
                  f'{name}_gt_labelTrainIds.png')
    return img, gt


def save_png(path: str, array: np.ndarray) -> None:
    os.makedirs(osp.dirname(path), exist_ok=True)
    Image.fromarray(array).save(path, format='PNG', optimize=False,
                                compress_level=6)


def make_acdc_like_tree(root: str,
                        conditions: Sequence[str] = ('fog', 'night', 'rain',
                                                     'snow'),
                        images_per_condition: int = 2,
                        size: Tuple[int, int] = (64, 32),
                        split: str = 'train',
                        seed: int = 0) -> str:
    """A tiny random ACDC-layout dataset (blocky label maps with 255 pixels,
    label-correlated noisy images); the same seed gives the same bytes."""
    width, height = size
    rng = np.random.default_rng(seed)
    palette = rng.integers(0, 256, size=(19, 3))
    for c_idx, condition in enumerate(conditions):
        for i in range(images_per_condition):
            labels = rng.integers(0, 19, size=(height // 8 + 1,
                                               width // 8 + 1))
            labels = np.kron(labels, np.ones((8, 8), dtype=np.int64))
            labels = labels[:height, :width].astype(np.uint8)
            labels[rng.random((height, width)) < 0.05] = 255
            image = palette[np.where(labels == 255, 0, labels)]
            image = image + rng.normal(0, 20 + 10 * c_idx, image.shape)
            image = np.clip(image, 0, 255).astype(np.uint8)
            img_path, gt_path = acdc_paths(root, condition, split,
                                           f'GOPR0{400 + i % 2}', i)
            save_png(img_path, image)
            save_png(gt_path, labels)
    return root
