"""Write small datasets in ACDC's on-disk layout (tests, quick checks)."""
import os
import os.path as osp
from typing import Sequence, Tuple

import numpy as np
from PIL import Image


def acdc_paths(root: str, condition: str, split: str, sequence: str,
               frame: int) -> Tuple[str, str]:
    """Image and label path of one ACDC frame.

    Args:
        root (str): dataset root.
        condition (str): e.g. ``'fog'``.
        split (str): e.g. ``'train'``.
        sequence (str): recording folder, e.g. ``'GOPR0400'``.
        frame (int): frame number (the file name has six digits).

    Returns:
        tuple[str, str]: the ``*_rgb_anon.png`` and
        ``*_gt_labelTrainIds.png`` paths.
    """
    name = f'{sequence}_frame_{frame:06d}'
    img = osp.join(root, 'rgb_anon', condition, split, sequence,
                   f'{name}_rgb_anon.png')
    gt = osp.join(root, 'gt', condition, split, sequence,
                  f'{name}_gt_labelTrainIds.png')
    return img, gt


def save_png(path: str, array: np.ndarray) -> None:
    """Write ``array`` (HxW uint8 or HxWx3 uint8 RGB) as a PNG, creating its
    folder; fixed encoder settings so equal arrays give equal bytes."""
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
    """Write a tiny random dataset in ACDC's layout.

    Label maps are 8x8-pixel blocks of random train IDs (0..18) with about
    5 % (at least one) ignore pixels (255); images are a per-class colour
    plus noise that grows with the condition index. Frames alternate between
    two sequence folders, so the sorted order differs from the write order.
    The same arguments give the same bytes.

    Args:
        root (str): dataset root (created if needed).
        conditions (Sequence[str]): condition folders to write.
        images_per_condition (int): frames per condition.
        size (tuple[int, int]): image ``(width, height)``.
        split (str): split folder name.
        seed (int): random seed.

    Returns:
        str: ``root``.
    """
    width, height = size
    if images_per_condition < 1 or width < 1 or height < 1:
        raise ValueError(f'make_acdc_like_tree: need images_per_condition '
                         f'>= 1 and a positive size, got '
                         f'{images_per_condition}, {size}')
    rng = np.random.default_rng(seed)
    palette = rng.integers(0, 256, size=(19, 3))
    for c_idx, condition in enumerate(conditions):
        for i in range(images_per_condition):
            labels = rng.integers(0, 19, size=(height // 8 + 1,
                                               width // 8 + 1))
            labels = np.kron(labels, np.ones((8, 8), dtype=np.int64))
            labels = labels[:height, :width].astype(np.uint8)
            labels[rng.random((height, width)) < 0.05] = 255
            if not (labels == 255).any():
                labels[0, 0] = 255
            image = palette[np.where(labels == 255, 0, labels)]
            image = image + rng.normal(0, 20 + 10 * c_idx, image.shape)
            image = np.clip(image, 0, 255).astype(np.uint8)
            img_path, gt_path = acdc_paths(root, condition, split,
                                           f'GOPR0{400 + i % 2}', i)
            save_png(img_path, image)
            save_png(gt_path, labels)
    return root
