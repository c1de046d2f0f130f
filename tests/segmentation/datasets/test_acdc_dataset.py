"""``ACDCContinualDataset`` on tiny generated data (``make_acdc_like_tree``
of ``demo_data/``): stream order, tags, paths, the real pipeline and config,
errors (the writer itself: tests/demo/test_demo_acdc_layout.py)."""
import os
import os.path as osp
import re

import numpy as np
import pytest
from mmengine.config import Config
from mmengine.registry import init_default_scope
from mmseg.datasets import CityscapesDataset
from mmseg.registry import DATASETS
from PIL import Image
from seg_helpers import REPO

from demo_data import make_acdc_like_tree
from mmseg_stag.engine.stream import StreamStage, dataset_stages, stage_of
from mmseg_stag.segmentation.datasets import ACDCContinualDataset

CONDS = ('fog', 'night', 'rain', 'snow')
PIPELINE = [
    dict(type='LoadImageFromFile'),
    dict(type='Resize', scale=(64, 32), keep_ratio=True),
    dict(type='LoadAnnotations'),
    dict(type='PackSegInputs'),
]


@pytest.fixture
def acdc(tmp_path):
    """3 images per condition, 96x48, in the real ACDC layout."""
    return make_acdc_like_tree(str(tmp_path / 'acdc'),
                               images_per_condition=3, size=(96, 48), seed=1)


def listed_images(root, cond, split='train'):
    """Independent listing: sorted relative image paths of a condition."""
    base = osp.join(root, 'rgb_anon', cond, split)
    return sorted(
        osp.relpath(osp.join(d, n), base) for d, _, ns in os.walk(base)
        for n in ns if n.endswith('_rgb_anon.png'))


# ------------------------------------------------------------ the stream
def test_stream_order_and_tags(acdc):
    ds = ACDCContinualDataset(data_root=acdc, rounds=2)
    per_cond = {c: listed_images(acdc, c) for c in CONDS}
    assert all(len(v) == 3 for v in per_cond.values())
    # frames alternate between two sequence folders: sorting matters
    assert per_cond['fog'][0].startswith('GOPR0400') and \
        per_cond['fog'][-1].startswith('GOPR0401')
    assert len(ds) == 2 * 4 * 3
    i = 0
    for r in range(2):
        for ci, cond in enumerate(CONDS):
            for rel in per_cond[cond]:
                info = ds.get_data_info(i)
                assert info['stage'] == r * 4 + ci
                assert info['round'] == r + 1
                assert info['condition'] == cond
                assert info['img_path'] == osp.join(acdc, 'rgb_anon', cond,
                                                    'train', rel)
                assert info['seg_map_path'] == osp.join(
                    acdc, 'gt', cond, 'train',
                    rel.replace('_rgb_anon.png', '_gt_labelTrainIds.png'))
                assert info['label_map'] is None
                assert info['reduce_zero_label'] is False
                assert info['seg_fields'] == []
                i += 1
    assert i == len(ds)


def test_default_is_the_paper_protocol(acdc):
    ds = ACDCContinualDataset(data_root=acdc)
    stages = [ds.get_data_info(i)['stage'] for i in range(len(ds))]
    assert len(ds) == 10 * 4 * 3 and sorted(set(stages)) == list(range(40))
    assert stages == sorted(stages)
    last = ds.get_data_info(len(ds) - 1)
    assert (last['stage'], last['round'], last['condition']) == (39, 10,
                                                                 'snow')
    assert ds.metainfo['classes'] == CityscapesDataset.METAINFO['classes']
    assert ds.metainfo['palette'] == CityscapesDataset.METAINFO['palette']
    assert len(ds.metainfo['classes']) == 19


def test_images_per_stage_counts_every_stage_and_keeps_the_first_one(acdc):
    """``images_per_stage_options(n)``: n images of every stage of the
    whole stream (not the first n of the stream, which are fog alone), and
    on a first stage alone the same images as its first n."""
    options = ACDCContinualDataset.images_per_stage_options(2)
    ds = ACDCContinualDataset(data_root=acdc, rounds=2, **options)
    assert [(s.condition, s.stop - s.start) for s in dataset_stages(ds)] == [
        (cond, 2) for _ in range(2) for cond in CONDS]
    first = dict(ACDCContinualDataset.first_stage_options({}, 'night'))
    one = ACDCContinualDataset(data_root=acdc, **first, **options)
    cut = ACDCContinualDataset(data_root=acdc, **first, indices=2)
    assert [one.get_data_info(i)['img_path'] for i in range(len(one))] == [
        cut.get_data_info(i)['img_path'] for i in range(len(cut))]


def test_the_dataset_declares_its_stages(acdc):
    """One stage per round and condition, none restarting from the source,
    tiling the stream;
    a subset (``indices``) keeps the stages of what is left."""
    ds = ACDCContinualDataset(data_root=acdc, rounds=2)
    stages = dataset_stages(ds)
    assert stages == [StreamStage(r * 4 + c, r + 1, cond, 3 * (r * 4 + c),
                                  3 * (r * 4 + c + 1))
                      for r in range(2) for c, cond in enumerate(CONDS)]
    for i in range(len(ds)):  # the same as each sample's tags
        info = ds.get_data_info(i)
        assert stage_of(stages, i).tags() == dict(
            stage=info['stage'], round=info['round'],
            condition=info['condition'])
    part = ACDCContinualDataset(data_root=acdc, rounds=1, indices=4)
    assert dataset_stages(part) == [StreamStage(0, 1, 'fog', 0, 3),
                                    StreamStage(1, 1, 'night', 3, 4)]


def test_config_packs_mmseg_default_keys():
    """The stages come from the dataset, not the packed samples: the
    configs keep PackSegInputs' defaults."""
    cfg = Config.fromfile(osp.join(
        REPO, 'configs/_base_/datasets/acdc_continual.py'))
    pack = [t for t in cfg.test_pipeline if t['type'] == 'PackSegInputs']
    assert pack == [dict(type='PackSegInputs')]


def test_stream_of_the_shared_tiny_data_through_the_pipeline(tiny_acdc):
    """The session's tiny data (2 images a condition) as the configs read
    it: two rounds, stage tags on the packed samples."""
    init_default_scope('mmseg')
    ds = ACDCContinualDataset(data_root=tiny_acdc, rounds=2,
                              pipeline=PIPELINE)
    assert len(ds) == 16
    infos = [ds.get_data_info(i) for i in range(16)]
    assert [i['condition'] for i in infos[:8:2]] == list(CONDS)
    assert [i['stage'] for i in infos] == [s for s in range(8)
                                           for _ in range(2)]
    assert [i['round'] for i in infos] == [1] * 8 + [2] * 8
    fog = [i['img_path'] for i in infos if i['condition'] == 'fog'][:2]
    assert fog == sorted(fog)
    assert fog[0].endswith(osp.join('rgb_anon', 'fog', 'train', 'GOPR0400',
                                    'GOPR0400_frame_000000_rgb_anon.png'))
    assert infos[0]['seg_map_path'].endswith(
        osp.join('gt', 'fog', 'train', 'GOPR0400',
                 'GOPR0400_frame_000000_gt_labelTrainIds.png'))
    sample = ds[5]
    assert stage_of(dataset_stages(ds), 5).tags() == dict(
        stage=2, round=1, condition='rain')
    labels = set(np.unique(sample['data_samples'].gt_sem_seg.data.numpy()))
    assert labels <= set(range(19)) | {255} and 255 in labels
    assert ds.metainfo['classes'][0] == 'road' and \
        len(ds.metainfo['classes']) == 19


def test_options_through_the_registry(acdc):
    """Config-style build: lists from configs, every option overridable."""
    init_default_scope('mmseg')
    ds = DATASETS.build(dict(type='ACDCContinualDataset', data_root=acdc,
                             conditions=['snow', 'fog'], rounds=3))
    conds = [ds.get_data_info(i)['condition'] for i in range(len(ds))]
    assert conds == (['snow'] * 3 + ['fog'] * 3) * 3
    assert [ds.get_data_info(i)['stage'] for i in range(0, 18, 3)] == list(
        range(6))
    # a single condition given as a string
    ds = ACDCContinualDataset(data_root=acdc, conditions='rain', rounds=1)
    assert len(ds) == 3
    # indices (BaseDataset) still work on the stream
    ds = ACDCContinualDataset(data_root=acdc, rounds=1, indices=4)
    assert len(ds) == 4 and ds.get_data_info(3)['condition'] == 'night'


def test_other_split_and_suffixes(tmp_path):
    root = make_acdc_like_tree(str(tmp_path / 'v'), conditions=('fog', ),
                               images_per_condition=2, split='val')
    ds = ACDCContinualDataset(data_root=root, conditions=('fog', ),
                              split='val', rounds=1)
    assert len(ds) == 2 and f'{os.sep}val{os.sep}' in ds[0]['img_path']
    # renamed files: suffixes are options
    for d, _, names in os.walk(root):
        for n in names:
            new = n.replace('_rgb_anon.png', '_img.png').replace(
                '_gt_labelTrainIds.png', '_lbl.png')
            os.rename(osp.join(d, n), osp.join(d, new))
    ds = ACDCContinualDataset(data_root=root, conditions=('fog', ),
                              split='val', rounds=1, img_suffix='_img.png',
                              seg_map_suffix='_lbl.png')
    assert ds[1]['seg_map_path'].endswith('_lbl.png')


def test_pipeline_carries_tags_and_labels(acdc):
    init_default_scope('mmseg')
    ds = ACDCContinualDataset(data_root=acdc, rounds=2, pipeline=PIPELINE)
    for idx in (0, 7, 13, 23):
        info = ds.get_data_info(idx)
        out = ds[idx]
        sample = out['data_samples']
        meta = sample.metainfo
        for key in ('img_path', 'seg_map_path'):
            assert meta[key] == info[key], key
        assert out['inputs'].shape == (3, 32, 64)  # resized, ratio kept
        assert meta['ori_shape'] == (48, 96)
        # the label map is loaded after Resize: original size, raw IDs
        gt = sample.gt_sem_seg.data.numpy()
        assert gt.shape == (1, 48, 96)
        on_disk = np.array(Image.open(info['seg_map_path']))
        np.testing.assert_array_equal(gt[0], on_disk)
        assert set(np.unique(gt)) <= set(range(19)) | {255}
        assert 255 in gt and (gt < 19).any()
    assert stage_of(dataset_stages(ds), 13).tags() == dict(
        stage=4, round=2, condition='fog')


def test_lazy_init(acdc):
    ds = ACDCContinualDataset(data_root=acdc, rounds=1, lazy_init=True)
    assert not ds._fully_initialized
    ds.full_init()
    assert len(ds) == 12


# ----------------------------------------------------------------- errors
def test_missing_data_root(tmp_path):
    missing = str(tmp_path / 'nowhere')
    with pytest.raises(FileNotFoundError, match=re.escape(missing)):
        ACDCContinualDataset(data_root=missing)
    with pytest.raises(FileNotFoundError, match='data_root'):
        ACDCContinualDataset(data_root=None)


def test_missing_condition_folder(acdc):
    expected = osp.join(acdc, 'rgb_anon', 'haze', 'train')
    with pytest.raises(FileNotFoundError, match=re.escape(expected)):
        ACDCContinualDataset(data_root=acdc, conditions=('fog', 'haze'))
    expected = osp.join(acdc, 'rgb_anon', 'fog', 'val')
    with pytest.raises(FileNotFoundError, match=re.escape(expected)):
        ACDCContinualDataset(data_root=acdc, split='val')


def test_unknown_condition_with_a_folder_is_fine(acdc):
    make_acdc_like_tree(acdc, conditions=('haze', ), images_per_condition=2)
    ds = ACDCContinualDataset(data_root=acdc, conditions=('haze', 'fog'),
                              rounds=1)
    assert [ds.get_data_info(i)['condition'] for i in range(5)] == \
        ['haze'] * 2 + ['fog'] * 3


def test_condition_without_images(acdc):
    folder = osp.join(acdc, 'rgb_anon', 'snow', 'train')
    for d, _, names in os.walk(folder):
        for n in names:
            os.remove(osp.join(d, n))
    with pytest.raises(FileNotFoundError, match=re.escape(folder)) as err:
        ACDCContinualDataset(data_root=acdc)
    assert 'no *_rgb_anon.png' in str(err.value)


def test_image_without_label(acdc):
    rel = listed_images(acdc, 'rain')[1]
    label = osp.join(acdc, 'gt', 'rain', 'train',
                     rel.replace('_rgb_anon.png', '_gt_labelTrainIds.png'))
    os.remove(label)
    with pytest.raises(FileNotFoundError, match=re.escape(label)):
        ACDCContinualDataset(data_root=acdc)


def test_bad_options(acdc):
    with pytest.raises(ValueError, match='rounds'):
        ACDCContinualDataset(data_root=acdc, rounds=0)
    with pytest.raises(ValueError, match='conditions'):
        ACDCContinualDataset(data_root=acdc, conditions=())
    with pytest.raises(ValueError, match='reduce_zero_label'):
        ACDCContinualDataset(data_root=acdc, reduce_zero_label=True)


# ---------------------------------------------------------- layout writer
