"""The classification trees of docs/data.md, written small and read through
the real configs (ImageNet-C, EATA's ImageNet val, CIFAR-C) and EcoTTA's
training-set reader (CIFAR's python batches)."""
import os
import os.path as osp
import pickle

import numpy as np
import pytest
from mmengine.config import Config
from PIL import Image

from mmseg_stag.classification import CLS_DATASETS, CorruptionStream
from mmseg_stag.classification.ecotta_warmup import read_training_set

REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
#: the first and last wnids, as the page shows them
WNIDS = ('n01440764', 'n15075141')
IMAGE = 'ILSVRC2012_val_00000293.JPEG'


def page():
    with open(osp.join(REPO, 'docs', 'data.md'), encoding='utf-8') as f:
        return f.read()


def shown(*names):
    text = page()
    for name in names:
        assert name in text, name


def config(name):
    return Config.fromfile(osp.join(REPO, 'configs', 'cls', name))


def class_folders(root, value=0):
    """Two classes of two JPEGs each, ``<root>/<wnid>/*.JPEG``."""
    for wnid in WNIDS:
        os.makedirs(osp.join(root, wnid))
        for k in range(2):
            Image.new('RGB', (80, 60), (value, 0, 0)).save(
                osp.join(root, wnid, IMAGE if k == 0 else
                         f'ILSVRC2012_val_{k:08d}.JPEG'))
    return root


def test_imagenet_c_tree(tmp_path):
    shown('data/imagenet-c/', 'gaussian_noise/', '5/', WNIDS[0], IMAGE)
    root = str(tmp_path / 'imagenet-c')
    corruptions = ['gaussian_noise', 'shot_noise']
    for k, name in enumerate(corruptions):
        class_folders(osp.join(root, name, '5'), value=60 + 120 * k)
        class_folders(osp.join(root, name, '1'), value=0)  # not read
    cfg = config('imagenet-c/imagenet-c_mild_resnet50-bn_tent.py')
    dataset = cfg.test_dataloader.dataset.to_dict()
    dataset.pop('type')
    dataset['corruption_set']['data_root'] = root
    dataset['corruptions'] = corruptions
    stream = CorruptionStream(**dataset)
    assert len(stream) == 8
    for i in range(len(stream)):
        sample = stream[i]
        meta = sample['data_samples'].metainfo
        k = corruptions.index(meta['corruption'])
        assert tuple(sample['inputs'].shape) == (3, 224, 224)
        # severity 5's colour (JPEG moves it a little)
        assert abs(int(sample['inputs'][0, 0, 0]) - 60 - 120 * k) <= 4
        assert meta['gt_label'] in (0, 1)


def test_sorted_imagenet_val_for_eata(tmp_path):
    shown('data/imagenet/val/', WNIDS[0] + '/', WNIDS[1] + '/', IMAGE)
    root = class_folders(str(tmp_path / 'val'))
    cfg = config('imagenet-c/imagenet-c_mild_vit-b16_eata.py')
    images = cfg.test_cfg.source_dataloader.dataset.images.to_dict()
    assert images['data_root'] == 'data/imagenet/val'
    data = CLS_DATASETS.build(dict(images, data_root=root))
    assert data.classes == list(WNIDS) and len(data) == 4


@pytest.mark.parametrize('name, folder', [
    ('cifar10-c_continual_wrn-28-10_tent.py', 'CIFAR-10-C'),
    ('cifar100-c_continual_wrn-40-2_tent.py', 'CIFAR-100-C')])
def test_cifar_c_tree(tmp_path, name, folder):
    """Five severities of ``n`` images a file; severity 5 is read."""
    shown(f'data/{folder}/', 'gaussian_noise.npy', 'labels.npy')
    n, root = 3, str(tmp_path / folder)
    os.makedirs(root)
    severity = np.repeat(np.arange(1, 6), n).astype(np.uint8)
    for c in ('gaussian_noise', 'shot_noise'):
        np.save(osp.join(root, f'{c}.npy'),
                np.broadcast_to(severity[:, None, None, None],
                                (5 * n, 32, 32, 3)).copy())
    np.save(osp.join(root, 'labels.npy'), np.tile(np.arange(n), 5))
    cfg = config('cifar-c/' + name)
    dataset = cfg.test_dataloader.dataset.to_dict()
    dataset.pop('type')
    assert dataset['corruption_set']['data_root'] == f'data/{folder}'
    dataset['corruption_set']['data_root'] = root
    dataset['corruptions'] = ['gaussian_noise', 'shot_noise']
    stream = CorruptionStream(**dataset)
    assert len(stream) == 2 * n
    assert all(int(stream[i]['inputs'].max()) == 5
               for i in range(len(stream)))


def batch(path, label_key, images, labels):
    """A CIFAR python batch: bytes keys, as ``encoding='bytes'`` reads the
    released (Python 2) files; protocol 4 keeps bytes free of the
    ``_codecs`` calls the numpy-only reader refuses."""
    with open(path, 'wb') as f:
        pickle.dump({b'data': images.transpose(0, 3, 1, 2).reshape(
            len(images), -1), label_key: [int(x) for x in labels]}, f,
            protocol=4)


def test_cifar_training_sets(tmp_path):
    shown('cifar-10-batches-py/', 'data_batch_1', 'data_batch_5',
          'cifar-100-python/', 'train', 'meta',
          '--train-data data/cifar-10-batches-py')
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (10, 32, 32, 3), np.uint8)
    labels = np.arange(10) % 3
    c10 = tmp_path / 'data' / 'cifar-10-batches-py'
    c10.mkdir(parents=True)
    for i in range(5):
        batch(c10 / f'data_batch_{i + 1}', b'labels', images[2 * i:2 * i + 2],
              labels[2 * i:2 * i + 2])
    c100 = tmp_path / 'data' / 'cifar-100-python'
    c100.mkdir()
    batch(c100 / 'train', b'fine_labels', images, labels)
    (c100 / 'meta').write_bytes(b'')
    for path in (str(c10), str(c100)):
        got, got_labels = read_training_set(path)
        np.testing.assert_array_equal(got, images)
        np.testing.assert_array_equal(got_labels, labels)
    # the parent holds both: CIFAR-10's batches come first
    got, _ = read_training_set(str(tmp_path / 'data'))
    assert len(got) == 10
