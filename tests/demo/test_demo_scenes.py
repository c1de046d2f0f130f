"""The offline demo's scene generator (``demo_data/scenes.py``): deterministic
files, Cityscapes classes, condition effects, and the ACDC/Cityscapes
layouts read back by the real dataset classes."""
import filecmp
import os
import os.path as osp

import numpy as np
import pytest
from PIL import Image

from demo_data import apply_condition, make_demo_benchmark, render_scene
from mmseg_stag.segmentation.datasets import ACDCContinualDataset

SMALL = dict(size=(64, 32), num_train=4, num_val=2, images_per_condition=2)


def all_files(root):
    return sorted(osp.relpath(osp.join(d, n), root)
                  for d, _, names in os.walk(root) for n in names)


def test_generator_is_deterministic(tmp_path):
    a = make_demo_benchmark(str(tmp_path / 'a'), seed=1, **SMALL)
    make_demo_benchmark(str(tmp_path / 'b'), seed=1, **SMALL)
    c = make_demo_benchmark(str(tmp_path / 'c'), seed=2, **SMALL)
    files = [f for f in all_files(tmp_path / 'a') if f.endswith('.png')]
    assert len(files) == 2 * (4 + 2) + 2 * 4 * 2
    for f in files:
        assert filecmp.cmp(tmp_path / 'a' / f, tmp_path / 'b' / f,
                           shallow=False), f
    assert not all(filecmp.cmp(tmp_path / 'a' / f, tmp_path / 'c' / f,
                               shallow=False) for f in files)
    assert a['acdc'].endswith('acdc') and c['cityscapes'].endswith(
        'cityscapes')
    # the manifest makes a second call a no-op
    stamp = os.stat(tmp_path / 'a' / files[0]).st_mtime_ns
    make_demo_benchmark(str(tmp_path / 'a'), seed=1, **SMALL)
    assert os.stat(tmp_path / 'a' / files[0]).st_mtime_ns == stamp


def test_scenes_use_cityscapes_classes_and_conditions_change_pixels():
    rng = np.random.default_rng(0)
    image, labels = render_scene(rng, (128, 64))
    assert image.shape == (64, 128, 3) and labels.shape == (64, 128)
    present = set(np.unique(labels))
    assert {0, 1, 2, 10, 13} <= present  # road sidewalk building sky car
    assert present <= set(range(19)) | {255} and 255 in present
    for condition in ('fog', 'night', 'rain', 'snow'):
        out = apply_condition(image, condition, seed=3)
        assert out.shape == image.shape and out.dtype == np.uint8
        assert np.abs(out.astype(int) - image).mean() > 5, condition
        assert np.array_equal(out, apply_condition(image, condition, 3))
    assert apply_condition(image, 'night', 3).mean() < image.mean() * 0.6
    with pytest.raises(ValueError, match='unknown condition'):
        apply_condition(image, 'hail', 0)


def test_generated_data_round_trips_through_real_dataset_classes(tmp_path):
    from mmengine.registry import init_default_scope
    from mmseg.datasets import CityscapesDataset
    init_default_scope('mmseg')
    paths = make_demo_benchmark(str(tmp_path), **SMALL)
    pipeline = [dict(type='LoadImageFromFile'),
                dict(type='LoadAnnotations'),
                dict(type='PackSegInputs',
                     meta_keys=('img_path', 'seg_map_path', 'ori_shape',
                                'img_shape', 'stage', 'round',
                                'condition'))]
    acdc = ACDCContinualDataset(data_root=paths['acdc'], rounds=1,
                                pipeline=pipeline)
    assert len(acdc) == 8
    info = acdc.get_data_info(2)
    assert info['condition'] == 'night'
    assert info['img_path'].endswith('_rgb_anon.png')
    assert info['seg_map_path'].endswith('_gt_labelTrainIds.png')
    assert '/rgb_anon/night/train/GOPR' in info['img_path']
    sample = acdc[2]
    gt = sample['data_samples'].gt_sem_seg.data.numpy()
    on_disk = np.array(Image.open(info['seg_map_path']))
    assert np.array_equal(gt[0], on_disk)
    assert set(np.unique(gt)) <= set(range(19)) | {255}
    city = CityscapesDataset(
        data_root=paths['cityscapes'],
        data_prefix=dict(img_path='leftImg8bit/train',
                         seg_map_path='gtFine/train'), pipeline=pipeline[:2])
    assert len(city) == 4
    assert city[0]['gt_seg_map'].shape == (32, 64)
