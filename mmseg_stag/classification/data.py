"""Corrupted classification test sets as released, as uint8 images."""
import os
import os.path as osp
from typing import Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
import torch
from PIL import Image
from torch.utils.data import Dataset

from .registry import CLS_DATASETS

#: the 15 ImageNet-C corruptions in the paper's evaluation order
CORRUPTIONS = ('gaussian_noise', 'shot_noise', 'impulse_noise',
               'defocus_blur', 'glass_blur', 'motion_blur', 'zoom_blur',
               'snow', 'frost', 'fog', 'brightness', 'contrast',
               'elastic_transform', 'pixelate', 'jpeg_compression')

#: column titles of the paper's tables
SHORT_NAMES = dict(zip(CORRUPTIONS, (
    'Gauss.', 'Shot', 'Impul.', 'Defoc.', 'Glass', 'Motion', 'Zoom', 'Snow',
    'Frost', 'Fog', 'Brit.', 'Contr.', 'Elastic', 'Pixel', 'JPEG')))

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
IMAGE_EXTENSIONS = ('.jpeg', '.jpg', '.png', '.bmp', '.webp')


def to_uint8_chw(image: np.ndarray) -> torch.Tensor:
    """Return a writable uint8 ``[3, H, W]`` copy of a ``[H, W, 3]`` image."""
    return torch.from_numpy(np.array(image, dtype=np.uint8)).permute(
        2, 0, 1).contiguous()


def imagenet_preprocess(image: Image.Image,
                        resize: Optional[int] = 256,
                        crop: Optional[int] = 224) -> torch.Tensor:
    """Return torchvision's ``Resize(256), CenterCrop(224)`` of ``image``
    (PIL only; None skips a step) as a uint8 ``[3, crop, crop]`` tensor."""
    image = image.convert('RGB')
    if resize is not None:
        w, h = image.size
        size = (resize, int(resize * h / w)) if w <= h else (
            int(resize * w / h), resize)
        if size != (w, h):
            image = image.resize(size, Image.BILINEAR)
    if crop is not None:
        w, h = image.size
        if w < crop or h < crop:
            raise ValueError(f'image of size {w}x{h} is smaller than the '
                             f'center crop {crop}')
        top = int(round((h - crop) / 2.0))
        left = int(round((w - crop) / 2.0))
        image = image.crop((left, top, left + crop, top + crop))
    return to_uint8_chw(np.asarray(image))


def _require(path: str, what: str, exists=osp.isdir) -> None:
    if not exists(path):
        raise FileNotFoundError(f'{what} not found: {path}')


def _check_images(images: np.ndarray, path: str) -> None:
    if images.ndim != 4 or images.shape[-1] != 3 or images.dtype != np.uint8:
        raise ValueError(f'{path}: expected uint8 [N, H, W, 3], '
                         f'got {images.dtype} {images.shape}')


def scan_class_folders(folder: str,
                       wnids: Union[None, str, Sequence[str]] = None,
                       n_examples: Optional[int] = None,
                       subset_seed: int = 0
                       ) -> Tuple[List[str], List[str], np.ndarray]:
    """Return ``(classes, image paths, labels)`` of ``<folder>/<wnid>/*.JPEG``
    (``wnids``: the class order, or a file of one wnid per line)."""
    present = sorted(d for d in os.listdir(folder)
                     if osp.isdir(osp.join(folder, d)))
    if isinstance(wnids, str):
        _require(wnids, 'wnid list file', osp.isfile)
        with open(wnids, encoding='utf-8') as f:
            wnids = [line.split()[0] for line in f if line.strip()]
    classes = present if wnids is None else list(wnids)
    unknown = sorted(set(present) - set(classes))
    if unknown:
        raise ValueError(f'{folder} has class folders not in the wnid '
                         f'list: {unknown[:5]}')
    paths, labels = [], []
    for label, wnid in enumerate(classes):
        class_dir = osp.join(folder, wnid)
        if not osp.isdir(class_dir):
            continue
        for name in sorted(os.listdir(class_dir)):
            if name.lower().endswith(IMAGE_EXTENSIONS):
                paths.append(osp.join(class_dir, name))
                labels.append(label)
    if not paths:
        raise FileNotFoundError(f'no images under {folder}')
    if n_examples is not None and n_examples < len(paths):
        keep = np.sort(np.random.default_rng(subset_seed).choice(
            len(paths), n_examples, replace=False))
        paths = [paths[i] for i in keep]
        labels = [labels[i] for i in keep]
    return classes, paths, np.asarray(labels, dtype=np.int64)


class CorruptionSet(Dataset):
    """Base of one corruption at one severity; items are ``(image, label)``
    read from the files ``paths``."""

    corruption: str
    severity: int
    labels: np.ndarray
    paths: List[str]

    def __len__(self) -> int:
        return len(self.labels)


class ImageFiles(CorruptionSet):
    """Items read from image files with :func:`imagenet_preprocess`."""

    transform_args: dict

    def __getitem__(self, index: int):
        with Image.open(self.paths[index]) as image:
            x = imagenet_preprocess(image, **self.transform_args)
        return x, int(self.labels[index])


class ArrayImages(CorruptionSet):
    """Items of a uint8 ``[N, H, W, 3]`` array, ``images``."""

    images: np.ndarray

    def __getitem__(self, index: int):
        return to_uint8_chw(self.images[index]), int(self.labels[index])


@CLS_DATASETS.register_module()
class ImageNetC(ImageFiles):
    """ImageNet-C images of one corruption and severity (1 to 5).

    Args:
        wnids (list[str] | str, optional): Class order, or a file of it.
            Default: None (the sorted class folders).
        n_examples (int, optional): Size of a random subset (seeded by
            ``subset_seed``). Default: None (all).
        resize, crop (int, optional): See :func:`imagenet_preprocess`.
    """

    def __init__(self,
                 data_root: str,
                 corruption: str,
                 severity: int = 5,
                 wnids: Union[None, str, Sequence[str]] = None,
                 n_examples: Optional[int] = None,
                 subset_seed: int = 0,
                 resize: Optional[int] = 256,
                 crop: Optional[int] = 224):
        self.corruption, self.severity = corruption, int(severity)
        self.transform_args = dict(resize=resize, crop=crop)
        _require(data_root, 'ImageNet-C root')
        _require(osp.join(data_root, corruption),
                 f'ImageNet-C corruption folder {corruption!r}')
        folder = osp.join(data_root, corruption, str(self.severity))
        _require(folder, f'ImageNet-C severity folder '
                 f'({corruption}, severity {self.severity})')
        self.classes, self.paths, self.labels = scan_class_folders(
            folder, wnids, n_examples, subset_seed)


@CLS_DATASETS.register_module()
class CIFARC(ArrayImages):
    """CIFAR-10-C / CIFAR-100-C arrays as released.

    Args:
        data_root (str): Folder of ``<corruption>.npy`` and ``labels.npy``.
        n_examples (int, optional): First images of that severity kept.
            Default: None (all).
        severities (Sequence[int]): Severities the files hold, in order.
    """

    def __init__(self,
                 data_root: str,
                 corruption: str,
                 severity: int = 5,
                 n_examples: Optional[int] = None,
                 severities: Sequence[int] = (1, 2, 3, 4, 5)):
        self.corruption, self.severity = corruption, int(severity)
        severities = [int(s) for s in severities]
        if self.severity not in severities:
            raise ValueError(f'severity {severity} not in the severities '
                             f'the files hold {severities}')
        _require(data_root, 'CIFAR-C root')
        images_path = osp.join(data_root, f'{corruption}.npy')
        labels_path = osp.join(data_root, 'labels.npy')
        _require(images_path, f'CIFAR-C file of corruption {corruption!r}',
                 osp.isfile)
        _require(labels_path, 'CIFAR-C labels file', osp.isfile)
        images = np.load(images_path, mmap_mode='r')
        labels = np.load(labels_path)
        _check_images(images, images_path)
        if len(images) != len(labels) or len(images) % len(severities):
            raise ValueError(
                f'{images_path} has {len(images)} images and {labels_path} '
                f'{len(labels)} labels; both must be {len(severities)} '
                f'severities x the same number of images')
        per = len(images) // len(severities)
        start = severities.index(self.severity) * per
        stop = start + (per if n_examples is None else min(n_examples, per))
        self.images = images[start:stop]
        self.labels = np.asarray(labels[start:stop], dtype=np.int64)
        self.paths = [images_path, labels_path]


@CLS_DATASETS.register_module()
class ImageFolder(ImageFiles):
    """Clean source images ``<data_root>/<wnid>/*.JPEG``, e.g. for EATA;
    the other arguments as :class:`ImageNetC`'s."""

    def __init__(self,
                 data_root: str,
                 wnids: Union[None, str, Sequence[str]] = None,
                 n_examples: Optional[int] = None,
                 subset_seed: int = 0,
                 resize: Optional[int] = 256,
                 crop: Optional[int] = 224):
        self.corruption, self.severity = 'clean', 0
        self.transform_args = dict(resize=resize, crop=crop)
        _require(data_root, 'clean image folder (source_data.data_root)')
        self.classes, self.paths, self.labels = scan_class_folders(
            data_root, wnids, n_examples, subset_seed)


@CLS_DATASETS.register_module()
class NumpyImages(ArrayImages):
    """Clean source images in a uint8 ``[N, H, W, 3]`` ``.npy`` file
    ``images``, with the ``labels`` ``.npy``; the first ``n_examples``."""

    def __init__(self,
                 images: str,
                 labels: str,
                 n_examples: Optional[int] = None):
        self.corruption, self.severity = 'clean', 0
        _require(images, 'source images file (source_data.images)', osp.isfile)
        _require(labels, 'source labels file (source_data.labels)', osp.isfile)
        array = np.load(images, mmap_mode='r')
        label_array = np.load(labels)
        _check_images(array, images)
        if len(array) != len(label_array):
            raise ValueError(f'{images} has {len(array)} images but {labels} '
                             f'{len(label_array)} labels')
        self.images = array[:n_examples]
        self.labels = np.asarray(label_array[:n_examples], dtype=np.int64)
        self.paths = [images, labels]


def build_corruption_sets(cfg: dict) -> Dict[str, CorruptionSet]:
    """Build one set per corruption of ``cfg`` (``type``, ``corruptions``
    and the dataset's arguments), in order."""
    cfg = dict(cfg)
    corruptions = list(cfg.pop('corruptions', CORRUPTIONS))
    if not corruptions:
        raise ValueError('test_dataloader.dataset.corruptions is empty')
    return {c: CLS_DATASETS.build(dict(cfg, corruption=c))
            for c in corruptions}


class StreamData:
    """Several corruption sets (``{name: set}``, in order) addressed by one
    global index."""

    def __init__(self, sets: Dict[str, CorruptionSet]):
        self.names = list(sets)
        self.sets = [sets[n] for n in self.names]
        sizes = [len(s) for s in self.sets]
        self.offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(
            np.int64)
        self.labels = np.concatenate([s.labels for s in self.sets])
        self.domain = np.repeat(np.arange(len(self.sets)), sizes)

    def __len__(self) -> int:
        return int(self.offsets[-1])

    def indices_of(self, name: str) -> np.ndarray:
        """Return the global indices of one corruption, in file order."""
        k = self.names.index(name)
        return np.arange(self.offsets[k], self.offsets[k + 1])

    def item(self, index: int) -> Tuple[torch.Tensor, int, int]:
        """Return ``(image, label, corruption index)`` of a global index."""
        k = int(self.domain[index])
        image, label = self.sets[k][int(index - self.offsets[k])]
        return image, label, k
