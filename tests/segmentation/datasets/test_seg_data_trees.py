"""The segmentation trees of docs/data.md, written small and read through
the real configs (ACDC's stream, EATA's Cityscapes val), and the smoke
test's ``--cfg-options`` of docs/get-started.md on a stand-in of ACDC's
size."""
import argparse
import os
import os.path as osp
import re
import shlex

import numpy as np
import pytest
from mmengine.config import Config, DictAction
from mmengine.registry import init_default_scope
from mmseg.registry import DATASETS
from PIL import Image
from seg_helpers import NVLABS_SEG_CFG, REPO

import mmseg_stag  # noqa: F401  (registers the ACDC stream)
from mmseg_stag.engine.stream import dataset_stages

CONDS = ('fog', 'night', 'rain', 'snow')
SEQ = 'GOPR0475'  # the recording docs/data.md shows


def page(name):
    with open(osp.join(REPO, 'docs', name), encoding='utf-8') as f:
        return f.read()


def write(path, array=None):
    """A PNG of ``array``, or an empty file (listing only)."""
    os.makedirs(osp.dirname(path), exist_ok=True)
    if array is None:
        open(path, 'wb').close()
    else:
        Image.fromarray(array).save(path)


def acdc_tree(root, frames, images=True):
    """ACDC as docs/data.md draws it, with the files it says are not read;
    train ID = the condition's index, label IDs 7 (not read)."""
    rng = np.random.default_rng(0)
    for c, cond in enumerate(CONDS):
        for k in range(frames):
            stem = f'{SEQ}_frame_{41 + k:06d}'
            img = rng.integers(0, 256, (36, 64, 3), np.uint8) if images \
                else None
            ids = np.full((36, 64), c, np.uint8) if images else None
            rgb = osp.join(root, 'rgb_anon', cond, 'train', SEQ)
            gt = osp.join(root, 'gt', cond, 'train', SEQ)
            write(osp.join(rgb, f'{stem}_rgb_anon.png'), img)
            write(osp.join(gt, f'{stem}_gt_labelTrainIds.png'), ids)
            write(osp.join(gt, f'{stem}_gt_labelIds.png'),
                  None if ids is None else ids + 7)
        for split in ('train_ref', 'val'):
            write(osp.join(root, 'rgb_anon', cond, split, SEQ,
                           f'{SEQ}_frame_000001_rgb_anon.png'))
    return root


def dataset_cfg(config, options):
    cfg = Config.fromfile(osp.join(REPO, config))
    cfg.merge_from_dict(options)
    return cfg.test_dataloader.dataset


def test_acdc_tree_of_the_data_page(tmp_path):
    text = page('data.md')
    for shown in (f'{SEQ}_frame_000041_rgb_anon.png',
                  f'{SEQ}_frame_000041_gt_labelTrainIds.png',
                  f'{SEQ}_frame_000041_gt_labelIds.png', 'train_ref/',
                  'rgb_anon/', 'gt/', 'data/acdc/'):
        assert shown in text, shown
    root = acdc_tree(str(tmp_path / 'acdc'), frames=2)
    init_default_scope('mmseg')
    ds = DATASETS.build(dataset_cfg(NVLABS_SEG_CFG.format('tent'), {
        'test_dataloader.dataset.data_root': root,
        'test_dataloader.dataset.rounds': 1}))
    assert len(ds) == 8  # train only: train_ref and val are not read
    assert [s.condition for s in dataset_stages(ds)] == list(CONDS)
    for i in range(len(ds)):
        sample = ds[i]
        labels = sample['data_samples'].gt_sem_seg.data
        # 16:9 to 960x540; the labels (train IDs) stay at the original size
        assert sample['inputs'].shape[-2:] == (540, 960)
        assert labels.shape[-2:] == (36, 64)
        assert set(labels.unique().tolist()) == {i // 2}


def smoke_options():
    """The ``--cfg-options`` of the smoke test in docs/get-started.md, as
    ``tools/test.py`` parses them."""
    text = page('get-started.md')
    section = text.split('## Smoke test on real ACDC')[1].split('\n## ')[0]
    block = re.search(r'```bash\n(.*?)```', section, re.S).group(1)
    words = shlex.split(block.replace('\\\n', ' '))
    parser = argparse.ArgumentParser()
    parser.add_argument('--cfg-options', nargs='+', action=DictAction)
    start = words.index('--cfg-options')
    return words[2], parser.parse_args(words[start:]).cfg_options


def test_smoke_test_reads_two_images_of_each_condition(tmp_path):
    """ACDC's 400 train images per condition, as empty files: the smoke
    test's ``images_per_condition`` keeps the first two of each, four
    stages."""
    config, options = smoke_options()
    assert options['test_dataloader.dataset.data_root'] == 'data/acdc'
    root = acdc_tree(str(tmp_path / 'acdc'), frames=400, images=False)
    options['test_dataloader.dataset.data_root'] = root
    init_default_scope('mmseg')
    ds = DATASETS.build(dataset_cfg(config, options))
    assert len(ds) == 8
    stages = dataset_stages(ds)
    assert [(s.condition, s.round, s.stop - s.start) for s in stages] == \
        [(c, 1, 2) for c in CONDS]
    frames = [osp.basename(ds.get_data_info(i)['img_path'])[:21]
              for i in range(len(ds))]
    assert frames == [f'{SEQ}_frame_{41 + k:06d}' for k in (0, 1) * 4]


def test_cityscapes_val_of_the_data_page(tmp_path):
    """EATA's clean images: ``leftImg8bit/val`` alone, no labels."""
    text = page('data.md')
    for shown in ('data/cityscapes/', 'leftImg8bit/', 'val/',
                  'frankfurt_000000_000294_leftImg8bit.png'):
        assert shown in text, shown
    root = str(tmp_path / 'cityscapes')
    for city in ('frankfurt', 'lindau', 'munster'):
        write(osp.join(root, 'leftImg8bit', 'val', city,
                       f'{city}_000000_000294_leftImg8bit.png'),
              np.zeros((32, 64, 3), np.uint8))
    write(osp.join(root, 'leftImg8bit', 'train', 'aachen',
                   'aachen_000000_000019_leftImg8bit.png'))
    cfg = Config.fromfile(osp.join(REPO, NVLABS_SEG_CFG.format('eata')))
    cfg.merge_from_dict(
        {'test_cfg.source_dataloader.dataset.data_root': root})
    init_default_scope('mmseg')
    ds = DATASETS.build(cfg.test_cfg.source_dataloader.dataset)
    assert len(ds) == 3
    assert ds[0]['inputs'].shape[-2:] == (480, 960)  # 2:1, keep ratio


@pytest.mark.parametrize('section', ['ACDC', 'Cityscapes val'])
def test_each_tree_has_its_commands(section):
    """Each segmentation section shows how its tree is made."""
    text = page('data.md').split(f'## {section}')[1].split('\n## ')[0]
    assert '```bash' in text and '```text' in text


def test_images_per_condition_below_one_is_refused(tmp_path):
    root = acdc_tree(str(tmp_path / 'acdc'), frames=2, images=False)
    init_default_scope('mmseg')
    with pytest.raises(ValueError, match='images_per_condition must be'):
        DATASETS.build(dict(type='ACDCContinualDataset', data_root=root,
                            rounds=1, images_per_condition=0))
