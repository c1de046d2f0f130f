"""Corrupted classification test sets as released, as uint8 images."""
import hashlib
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
SHORT_NAMES = {
    'gaussian_noise': 'Gauss.', 'shot_noise': 'Shot',
    'impulse_noise': 'Impul.', 'defocus_blur': 'Defoc.',
    'glass_blur': 'Glass', 'motion_blur': 'Motion', 'zoom_blur': 'Zoom',
    'snow': 'Snow', 'frost': 'Frost', 'fog': 'Fog', 'brightness': 'Brit.',
    'contrast': 'Contr.', 'elastic_transform': 'Elastic',
    'pixelate': 'Pixel', 'jpeg_compression': 'JPEG'
}

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
    """Apply torchvision's ``Resize(256), CenterCrop(224)`` with PIL only.

    Args:
        image (Image.Image): A PIL image, converted to RGB.
        resize (int, optional): Shorter side after a bilinear resize; None
            skips it. Default: 256.
        crop (int, optional): Side of the center crop; None skips it.
            Default: 224.

    Returns:
        torch.Tensor: ``[3, crop, crop]`` uint8 image.

    Raises:
        ValueError: If the image is smaller than the crop.
    """
    image = image.convert('RGB')
    if resize is not None:
        w, h = image.size
        if w <= h:
            size = (resize, int(resize * h / w))
        else:
            size = (int(resize * w / h), resize)
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


def _require_dir(path: str, what: str) -> None:
    if not osp.isdir(path):
        raise FileNotFoundError(f'{what} not found: {path}')


def _require_file(path: str, what: str) -> None:
    if not osp.isfile(path):
        raise FileNotFoundError(f'{what} not found: {path}')


def read_wnids(wnids: Union[str, Sequence[str]]) -> List[str]:
    """Return a wnid list given inline or as a file of one wnid per line."""
    if isinstance(wnids, str):
        _require_file(wnids, 'wnid list file')
        with open(wnids, encoding='utf-8') as f:
            return [line.split()[0] for line in f if line.strip()]
    return list(wnids)


def scan_class_folders(folder: str,
                       wnids: Union[None, str, Sequence[str]] = None,
                       n_examples: Optional[int] = None,
                       subset_seed: int = 0
                       ) -> Tuple[List[str], List[str], np.ndarray]:
    """Return ``(classes, image paths, labels)`` of ``<folder>/<wnid>/*.JPEG``.

    Raises:
        ValueError: If a class folder is not in ``wnids``.
        FileNotFoundError: If there are no images.
    """
    present = sorted(d for d in os.listdir(folder)
                     if osp.isdir(osp.join(folder, d)))
    classes = read_wnids(wnids) if wnids is not None else present
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
    """Base of one corruption at one severity; items are ``(image, label)``."""

    corruption: str
    severity: int
    labels: np.ndarray

    def __len__(self) -> int:
        return len(self.labels)

    def files(self) -> List[str]:
        """Return the files the items are read from."""
        return []

    def fingerprint(self) -> str:
        """Return a hash of the labels, file names, sizes and times."""
        h = hashlib.sha1(f'{self.corruption}/{self.severity}'.encode())
        h.update(np.ascontiguousarray(self.labels).tobytes())
        for path in self.files():
            st = os.stat(path)
            h.update(f'{path}:{st.st_size}:{st.st_mtime_ns}'.encode())
        return h.hexdigest()[:16]



class ImageFiles(CorruptionSet):
    """Items read from image files with :func:`imagenet_preprocess`."""

    paths: List[str]
    transform_args: dict

    def files(self) -> List[str]:
        return self.paths

    def __getitem__(self, index: int):
        with Image.open(self.paths[index]) as image:
            x = imagenet_preprocess(image, **self.transform_args)
        return x, int(self.labels[index])


@CLS_DATASETS.register_module()
class ImageNetC(ImageFiles):
    """ImageNet-C images of one corruption and severity.

    Args:
        data_root (str): The ImageNet-C root.
        corruption (str): E.g. ``'gaussian_noise'``.
        severity (int): 1 to 5. Default: 5.
        wnids (list[str] | str, optional): Class order, or a file of it.
            Default: None (the sorted class folders).
        n_examples (int, optional): Size of a seeded random subset.
            Default: None (all).
        subset_seed (int): Seed of that subset. Default: 0.
        resize (int, optional): See :func:`imagenet_preprocess`.
        crop (int, optional): See :func:`imagenet_preprocess`.
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
        _require_dir(data_root, 'ImageNet-C root')
        _require_dir(osp.join(data_root, corruption),
                     f'ImageNet-C corruption folder {corruption!r}')
        folder = osp.join(data_root, corruption, str(self.severity))
        _require_dir(folder, f'ImageNet-C severity folder '
                     f'({corruption}, severity {self.severity})')
        self.classes, self.paths, self.labels = scan_class_folders(
            folder, wnids, n_examples, subset_seed)


@CLS_DATASETS.register_module()
class CIFARC(CorruptionSet):
    """CIFAR-10-C / CIFAR-100-C arrays as released.

    Args:
        data_root (str): Folder of ``<corruption>.npy`` and ``labels.npy``.
        corruption (str): E.g. ``'gaussian_noise'``.
        severity (int): 1 to 5. Default: 5.
        n_examples (int, optional): First images of that severity kept.
            Default: None (all).
        severities (Sequence[int]): Severities the files hold, in order.
            Default: (1, 2, 3, 4, 5).

    Raises:
        ValueError: If the files do not hold the severity or mismatch.
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
        _require_dir(data_root, 'CIFAR-C root')
        images_path = osp.join(data_root, f'{corruption}.npy')
        labels_path = osp.join(data_root, 'labels.npy')
        _require_file(images_path, f'CIFAR-C file of corruption '
                      f'{corruption!r}')
        _require_file(labels_path, 'CIFAR-C labels file')
        images = np.load(images_path, mmap_mode='r')
        labels = np.load(labels_path)
        if images.ndim != 4 or images.shape[-1] != 3 or \
                images.dtype != np.uint8:
            raise ValueError(f'{images_path}: expected uint8 [N, H, W, 3], '
                             f'got {images.dtype} {images.shape}')
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
        self.path = images_path
        self.labels_path = labels_path

    def files(self) -> List[str]:
        return [self.path, self.labels_path]

    def __getitem__(self, index: int):
        return to_uint8_chw(self.images[index]), int(self.labels[index])



@CLS_DATASETS.register_module()
class ImageFolder(ImageFiles):
    """Clean source images ``<data_root>/<wnid>/*.JPEG``, e.g. for EATA.

    Args:
        data_root (str): The folder of class folders.
        wnids (list[str] | str, optional): See :class:`ImageNetC`.
        n_examples (int, optional): See :class:`ImageNetC`.
        subset_seed (int): See :class:`ImageNetC`. Default: 0.
        resize (int, optional): See :func:`imagenet_preprocess`.
        crop (int, optional): See :func:`imagenet_preprocess`.
    """

    def __init__(self,
                 data_root: str,
                 wnids: Union[None, str, Sequence[str]] = None,
                 n_examples: Optional[int] = None,
                 subset_seed: int = 0,
                 resize: Optional[int] = 256,
                 crop: Optional[int] = 224):
        self.corruption, self.severity = 'clean', 0
        self.transform_args = dict(resize=resize, crop=crop)
        _require_dir(data_root, 'clean image folder (source_data.data_root)')
        self.classes, self.paths, self.labels = scan_class_folders(
            data_root, wnids, n_examples, subset_seed)


@CLS_DATASETS.register_module()
class NumpyImages(CorruptionSet):
    """Clean source images in a uint8 ``[N, H, W, 3]`` ``.npy`` file.

    Args:
        images (str): Path of the images ``.npy``.
        labels (str): Path of the labels ``.npy``.
        n_examples (int, optional): First images kept. Default: None (all).
    """

    def __init__(self,
                 images: str,
                 labels: str,
                 n_examples: Optional[int] = None):
        self.corruption, self.severity = 'clean', 0
        _require_file(images, 'source images file (source_data.images)')
        _require_file(labels, 'source labels file (source_data.labels)')
        array = np.load(images, mmap_mode='r')
        label_array = np.load(labels)
        if array.ndim != 4 or array.shape[-1] != 3 or array.dtype != np.uint8:
            raise ValueError(f'{images}: expected uint8 [N, H, W, 3], got '
                             f'{array.dtype} {array.shape}')
        if len(array) != len(label_array):
            raise ValueError(f'{images} has {len(array)} images but {labels} '
                             f'{len(label_array)} labels')
        stop = len(array) if n_examples is None else min(n_examples,
                                                         len(array))
        self.images = array[:stop]
        self.labels = np.asarray(label_array[:stop], dtype=np.int64)
        self.paths = [images, labels]

    def files(self) -> List[str]:
        return self.paths

    def __getitem__(self, index: int):
        return to_uint8_chw(self.images[index]), int(self.labels[index])



def build_corruption_sets(cfg: dict) -> Dict[str, CorruptionSet]:
    """Build one corruption set per corruption of ``cfg``, in order.

    Args:
        cfg (dict): ``type``, ``corruptions`` and the dataset's arguments.

    Returns:
        dict[str, CorruptionSet]: The sets by corruption.
    """
    cfg = dict(cfg)
    corruptions = list(cfg.pop('corruptions', CORRUPTIONS))
    if not corruptions:
        raise ValueError('data.corruptions is empty')
    return {c: CLS_DATASETS.build(dict(cfg, corruption=c))
            for c in corruptions}


class StreamData:
    """Several corruption sets addressed by one global index.

    Args:
        sets (dict[str, CorruptionSet]): The sets, in order.
    """

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

    def fingerprint(self) -> str:
        """Return a hash of the sets' fingerprints."""
        return hashlib.sha1(''.join(
            s.fingerprint() for s in self.sets).encode()).hexdigest()[:16]

    def indices_of(self, name: str) -> np.ndarray:
        """Return the global indices of one corruption, in file order."""
        k = self.names.index(name)
        return np.arange(self.offsets[k], self.offsets[k + 1])

    def item(self, index: int) -> Tuple[torch.Tensor, int, int]:
        """Return ``(image, label, corruption index)`` of a global index."""
        k = int(self.domain[index])
        image, label = self.sets[k][int(index - self.offsets[k])]
        return image, label, k
