"""Classification data: the CIFAR-C ``.npy`` and ImageNet-C folder loaders on
tiny files of the real formats, preprocessing, and the stream index."""
import os
import os.path as osp

import numpy as np
import pytest
import torch
from PIL import Image

from mmseg_stag.classification import (CIFARC, CORRUPTIONS, IMAGENET_MEAN,
                                       IMAGENET_STD, ImageNetC, StreamData,
                                       build_corruption_sets,
                                       imagenet_preprocess, to_uint8_chw)

N_PER_SEVERITY = 6


def make_cifar_c(root, corruptions=('gaussian_noise', 'shot_noise'),
                 n=N_PER_SEVERITY, severities=(1, 2, 3, 4, 5)):
    """Files in the released layout; pixel [0, 0, 0] of an image encodes
    ``10 * severity + index`` so slicing can be checked."""
    os.makedirs(root, exist_ok=True)
    rng = np.random.default_rng(0)
    labels_one = rng.integers(0, 10, n)
    np.save(osp.join(root, 'labels.npy'),
            np.tile(labels_one, len(severities)))
    for c in corruptions:
        arr = rng.integers(0, 256, (len(severities) * n, 32, 32, 3),
                           dtype=np.uint8)
        for k, s in enumerate(severities):
            arr[k * n:(k + 1) * n, 0, 0, 0] = 10 * s + np.arange(n)
        np.save(osp.join(root, f'{c}.npy'), arr)
    return root, labels_one


def test_cifar_c_severity_slicing_and_labels(tmp_path):
    root, labels = make_cifar_c(str(tmp_path))
    for severity in (1, 3, 5):
        ds = CIFARC(root, 'gaussian_noise', severity=severity)
        assert len(ds) == N_PER_SEVERITY
        np.testing.assert_array_equal(ds.labels, labels)
        x, y = ds[2]
        assert x.shape == (3, 32, 32) and x.dtype == torch.uint8
        assert y == labels[2]
        assert int(x[0, 0, 0]) == 10 * severity + 2
        assert int(ds[4][0][0, 0, 0]) == 10 * severity + 4


def test_cifar_c_n_examples_and_normalisation(tmp_path):
    from mmseg_stag.classification import ClassifierPreprocessor
    root, labels = make_cifar_c(str(tmp_path))
    ds = CIFARC(root, 'shot_noise', severity=2, n_examples=4)
    assert len(ds) == 4
    np.testing.assert_array_equal(ds.labels, labels[:4])
    raw = np.load(osp.join(root, 'shot_noise.npy'))[N_PER_SEVERITY + 1]
    expected = (torch.from_numpy(raw).float() / 255 - 0.5) / 0.25
    pre = ClassifierPreprocessor(mean=(0.5, 0.5, 0.5), std=(0.25, 0.25, 0.25))
    out = pre(dict(inputs=[ds[1][0]]))['inputs']
    torch.testing.assert_close(out[0], expected.permute(2, 0, 1))
    plain = ClassifierPreprocessor()(dict(inputs=[ds[1][0]]))['inputs']
    torch.testing.assert_close(plain[0],
                               torch.from_numpy(raw).float().permute(
                                   2, 0, 1) / 255)


def test_cifar_c_single_severity_file(tmp_path):
    root, labels = make_cifar_c(str(tmp_path), severities=(5, ))
    ds = CIFARC(root, 'gaussian_noise', severity=5, severities=(5, ))
    assert len(ds) == N_PER_SEVERITY
    assert int(ds[0][0][0, 0, 0]) == 50
    with pytest.raises(ValueError, match='severity 3'):
        CIFARC(root, 'gaussian_noise', severity=3, severities=(5, ))


def test_cifar_c_missing_files(tmp_path):
    root, _ = make_cifar_c(str(tmp_path))
    with pytest.raises(FileNotFoundError, match='glass_blur.npy'):
        CIFARC(root, 'glass_blur')
    with pytest.raises(FileNotFoundError, match='CIFAR-C root'):
        CIFARC(str(tmp_path / 'nowhere'), 'gaussian_noise')
    os.remove(osp.join(root, 'labels.npy'))
    with pytest.raises(FileNotFoundError, match='labels.npy'):
        CIFARC(root, 'gaussian_noise')


def test_cifar_c_rejects_wrong_sizes(tmp_path):
    root, _ = make_cifar_c(str(tmp_path))
    np.save(osp.join(root, 'labels.npy'), np.zeros(7, dtype=np.int64))
    with pytest.raises(ValueError, match='5 severities'):
        CIFARC(root, 'gaussian_noise')


WNIDS = ('n01440764', 'n01443537', 'n01484850')


def make_imagenet_c(root, corruption='gaussian_noise', severity=5,
                    per_class=(2, 3, 1)):
    """``<root>/<corruption>/<severity>/<wnid>/*.JPEG``; classes created
    in reverse order so that the loader must sort them."""
    for wnid, n in reversed(list(zip(WNIDS, per_class))):
        d = osp.join(root, corruption, str(severity), wnid)
        os.makedirs(d, exist_ok=True)
        for i in range(n):
            Image.new('RGB', (240, 200), (10 * i, 100, 200)).save(
                osp.join(d, f'ILSVRC2012_val_{wnid[-3:]}{i}.JPEG'),
                format='JPEG')
    return root


def test_imagenet_c_folder_label_order(tmp_path):
    root = make_imagenet_c(str(tmp_path))
    ds = ImageNetC(root, 'gaussian_noise', severity=5)
    assert ds.classes == list(WNIDS)
    assert ds.labels.tolist() == [0, 0, 1, 1, 1, 2]
    x, y = ds[3]
    assert x.shape == (3, 224, 224) and x.dtype == torch.uint8 and y == 1


def test_imagenet_c_given_wnid_list(tmp_path):
    root = make_imagenet_c(str(tmp_path))
    order = ['n09999999', WNIDS[2], WNIDS[0], WNIDS[1]]
    ds = ImageNetC(root, 'gaussian_noise', wnids=order)
    # folders are read in the list's order; the index is the list position
    assert ds.labels.tolist() == [1, 2, 2, 3, 3, 3]
    wnid_file = tmp_path / 'wnids.txt'
    wnid_file.write_text('\n'.join(order) + '\n')
    ds2 = ImageNetC(root, 'gaussian_noise', wnids=str(wnid_file))
    assert ds2.labels.tolist() == ds.labels.tolist()
    with pytest.raises(ValueError, match='not in the wnid list'):
        ImageNetC(root, 'gaussian_noise', wnids=[WNIDS[0]])


def test_imagenet_c_subset_is_seeded(tmp_path):
    root = make_imagenet_c(str(tmp_path))
    a = ImageNetC(root, 'gaussian_noise', n_examples=4, subset_seed=3)
    b = ImageNetC(root, 'gaussian_noise', n_examples=4, subset_seed=3)
    assert len(a) == 4 and a.paths == b.paths
    assert a.paths == sorted(a.paths)


def test_imagenet_c_missing_folders(tmp_path):
    root = make_imagenet_c(str(tmp_path))
    with pytest.raises(FileNotFoundError, match="'fog'"):
        ImageNetC(root, 'fog')
    with pytest.raises(FileNotFoundError, match='severity 3'):
        ImageNetC(root, 'gaussian_noise', severity=3)
    with pytest.raises(FileNotFoundError, match='ImageNet-C root'):
        ImageNetC(str(tmp_path / 'nowhere'), 'gaussian_noise')


def test_imagenet_preprocess_matches_the_recipe():
    from mmseg_stag.classification import ClassifierPreprocessor
    rng = np.random.default_rng(0)
    arr = rng.integers(0, 256, (300, 400, 3), dtype=np.uint8)
    out = imagenet_preprocess(Image.fromarray(arr))
    assert out.shape == (3, 224, 224) and out.dtype == torch.uint8
    # resize the shorter side to 256 (341x256), center crop 224
    ref = Image.fromarray(arr).resize((341, 256), Image.BILINEAR)
    ref = np.asarray(ref)[16:240, 58:282]
    torch.testing.assert_close(out, to_uint8_chw(ref))
    flat = imagenet_preprocess(Image.new('RGB', (224, 224), (255, 0, 51)),
                               resize=None)
    mean, std = torch.tensor(IMAGENET_MEAN), torch.tensor(IMAGENET_STD)
    # ToTensor, Normalize: the OnlineClassifier's data preprocessor
    pre = ClassifierPreprocessor(mean=IMAGENET_MEAN, std=IMAGENET_STD)
    torch.testing.assert_close(
        pre(dict(inputs=[flat]))['inputs'][0][:, 5, 7],
        (torch.tensor([1.0, 0.0, 0.2]) - mean) / std)
    with pytest.raises(ValueError, match='smaller than the center crop'):
        imagenet_preprocess(Image.new('RGB', (100, 100)), resize=None)


def test_stream_data_global_index(tmp_path):
    root, labels = make_cifar_c(str(tmp_path))
    sets = build_corruption_sets(dict(
        type='CIFARC', data_root=root, severity=4,
        corruptions=['shot_noise', 'gaussian_noise']))
    data = StreamData(sets)
    assert data.names == ['shot_noise', 'gaussian_noise'] and len(data) == 12
    np.testing.assert_array_equal(data.indices_of('gaussian_noise'),
                                  np.arange(6, 12))
    x, y, d = data.item(7)
    assert (y, d) == (labels[1], 1)
    torch.testing.assert_close(x, sets['gaussian_noise'][1][0])
    x, y, d = data.item(1)
    assert (y, d) == (labels[1], 0)
    torch.testing.assert_close(x, sets['shot_noise'][1][0])


def test_corruption_order_is_the_papers():
    assert len(CORRUPTIONS) == 15
    assert CORRUPTIONS[0] == 'gaussian_noise'
    assert CORRUPTIONS[-1] == 'jpeg_compression'


# ------------------------------------------------ clean source-domain data
def test_image_folder_reads_the_imagenet_val_layout(tmp_path):
    from mmseg_stag.classification import ImageFolder
    root = tmp_path / 'val'
    for wnid, n in reversed(list(zip(WNIDS, (2, 1, 3)))):
        os.makedirs(root / wnid)
        for i in range(n):
            Image.new('RGB', (64, 48), (40 * i, 7, 9)).save(
                root / wnid / f'ILSVRC2012_val_{i}.JPEG', format='JPEG')
    ds = ImageFolder(str(root), resize=None, crop=None)
    assert ds.classes == sorted(WNIDS)
    assert ds.labels.tolist() == [0, 0, 1, 2, 2, 2]
    assert ds[3][0].shape == (3, 48, 64) and ds[3][0].dtype == torch.uint8
    sub = ImageFolder(str(root), n_examples=4, subset_seed=1)
    assert len(sub) == 4 and sub[0][0].shape == (3, 224, 224)
    with pytest.raises(FileNotFoundError, match='source_data.data_root'):
        ImageFolder(str(tmp_path / 'nowhere'))


def test_numpy_images_checks_its_files(tmp_path):
    from mmseg_stag.classification import NumpyImages
    images = np.random.default_rng(0).integers(0, 256, (5, 8, 8, 3),
                                               dtype=np.uint8)
    np.save(tmp_path / 'x.npy', images)
    np.save(tmp_path / 'y.npy', np.arange(5))
    ds = NumpyImages(str(tmp_path / 'x.npy'), str(tmp_path / 'y.npy'),
                     n_examples=3)
    assert len(ds) == 3 and ds.labels.tolist() == [0, 1, 2]
    torch.testing.assert_close(ds[2][0], to_uint8_chw(images[2]))
    with pytest.raises(FileNotFoundError, match='source_data.labels'):
        NumpyImages(str(tmp_path / 'x.npy'), str(tmp_path / 'none.npy'))
    np.save(tmp_path / 'y4.npy', np.arange(4))
    with pytest.raises(ValueError, match='4 labels'):
        NumpyImages(str(tmp_path / 'x.npy'), str(tmp_path / 'y4.npy'))
