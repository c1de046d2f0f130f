"""Labels through the loader: CoTTA's views read the label once and only the
scored view carries it; labels travel as uint8. The scored label equals
what the per-view loading of CoTTA's code gave."""
import numpy as np
import pytest
import torch
from mmengine.config import Config
from mmengine.registry import init_default_scope
from mmseg.datasets.transforms import LoadAnnotations
from PIL import Image
from seg_helpers import REPO

from demo_data import make_acdc_like_tree
from mmseg_stag.segmentation.datasets import ACDCContinualDataset

VIEWS = dict(type='ScaleFlipViews', scale=(64, 32), ratios=(0.5, 1.0, 1.5),
             flip=True)
PACK = dict(type='PackSegInputs')


@pytest.fixture
def acdc(tmp_path):
    return make_acdc_like_tree(str(tmp_path / 'acdc'),
                               images_per_condition=2, size=(96, 48), seed=3)


def dataset(root, pipeline):
    init_default_scope('mmseg')
    return ACDCContinualDataset(data_root=root, rounds=1, pipeline=pipeline)


def count_label_loads(monkeypatch):
    calls = []
    load = LoadAnnotations._load_seg_map

    def counted(self, results):
        calls.append(results['seg_map_path'])
        return load(self, results)

    monkeypatch.setattr(LoadAnnotations, '_load_seg_map', counted)
    return calls


def test_views_load_the_label_once_for_the_main_view(acdc, monkeypatch):
    per_view = dataset(acdc, [dict(type='LoadImageFromFile'), dict(
        VIEWS, transforms=[dict(type='LoadAnnotations'), PACK])])
    once = dataset(acdc, [dict(type='LoadImageFromFile'), dict(
        VIEWS, load_label=True, transforms=[PACK])])
    calls = count_label_loads(monkeypatch)
    old = per_view[3]
    assert len(calls) == 6  # CoTTA's code: one read per view
    calls.clear()
    new = once[3]
    assert len(calls) == 1
    main = once.pipeline.transforms[1].main_view
    label = new['data_samples'][main].gt_sem_seg.data
    assert label.dtype == torch.uint8 and label.shape == (1, 48, 96)
    assert torch.equal(label.long(),
                       old['data_samples'][main].gt_sem_seg.data)
    on_disk = np.array(Image.open(once.get_data_info(3)['seg_map_path']))
    np.testing.assert_array_equal(label[0].numpy(), on_disk)
    for k, sample in enumerate(new['data_samples']):
        assert ('gt_sem_seg' in sample) == (k == main), k
    # the images of every view are unchanged
    for a, b in zip(old['inputs'], new['inputs']):
        assert torch.equal(a, b)


def test_labels_as_uint8_keeps_the_values(acdc):
    plain = [dict(type='LoadImageFromFile'),
             dict(type='Resize', scale=(64, 32), keep_ratio=True),
             dict(type='LoadAnnotations'), PACK]
    a = dataset(acdc, plain)[1]['data_samples'].gt_sem_seg.data
    b = dataset(acdc, plain + [dict(type='LabelsAsUint8')])[1][
        'data_samples'].gt_sem_seg.data
    assert a.dtype == torch.int64 and b.dtype == torch.uint8
    assert torch.equal(a, b.long()) and (a == 255).any()


def test_the_acdc_configs_use_them():
    plain = Config.fromfile(f'{REPO}/configs/_base_/datasets/'
                            'acdc_continual.py')
    assert [t['type'] for t in plain.test_pipeline][-1] == 'LabelsAsUint8'
    views = Config.fromfile(f'{REPO}/configs/_base_/datasets/'
                            'acdc_continual_views.py')
    step = views.test_dataloader.dataset.pipeline[1]
    assert step['type'] == 'ScaleFlipViews' and step['load_label']
    assert [t['type'] for t in step['transforms']] == ['PackSegInputs']
