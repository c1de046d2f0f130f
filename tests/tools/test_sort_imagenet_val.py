"""``tools/sort_imagenet_val.py`` on a tiny generated stand-in of the flat
ImageNet validation folder: the sorted tree is what ``ImageFolder`` (EATA's
clean images) reads, from a labels file or from a devkit's ``meta.mat``."""
import os
import os.path as osp

import numpy as np
import pytest
from PIL import Image

from mmseg_stag.classification.data import ImageFolder

#: image k+1 of the stand-in and its class (three classes, unsorted)
WNIDS = ['n01440764', 'n15075141', 'n01443537', 'n01440764', 'n15075141',
         'n01443537', 'n01440764']


def name(k):
    return f'ILSVRC2012_val_{k:08d}.JPEG'


def flat_val(root):
    """The flat folder as ``ILSVRC2012_img_val.tar`` unpacks."""
    os.makedirs(root)
    for k in range(1, len(WNIDS) + 1):
        Image.new('RGB', (40, 30), (k * 30, 0, 0)).save(
            osp.join(root, name(k)))
    return root


def check_sorted(root):
    data = ImageFolder(data_root=root, resize=None, crop=None)
    assert data.classes == sorted(set(WNIDS))
    for path, label in zip(data.paths, data.labels):
        k = int(osp.basename(path)[15:23])
        assert data.classes[label] == WNIDS[k - 1]
        assert osp.basename(osp.dirname(path)) == WNIDS[k - 1]
    assert len(data) == len(WNIDS)


def test_labels_file_sorts_in_place_once(tmp_path, load_tool, capsys):
    tool = load_tool('sort_imagenet_val')
    val = flat_val(str(tmp_path / 'val'))
    labels = tmp_path / 'LOC_val_solution.csv'
    # a header, names without extension, commas and extra fields
    labels.write_text('ImageId,PredictionString\n' + ''.join(
        f'{name(k)[:-5]},{w} 1 2 3 4\n' for k, w in enumerate(WNIDS, 1)))
    tool.main([val, '--labels', str(labels)])
    assert sorted(os.listdir(val)) == sorted(set(WNIDS))
    check_sorted(val)
    tool.main([val, '--labels', str(labels)])  # nothing left to do
    assert 'moved 0 images' in capsys.readouterr().out
    check_sorted(val)


def test_copy_elsewhere_keeps_the_flat_folder(tmp_path, load_tool):
    tool = load_tool('sort_imagenet_val')
    val = flat_val(str(tmp_path / 'val'))
    labels = tmp_path / 'val.txt'
    labels.write_text(''.join(f'{name(k)}\t{w}\n'
                              for k, w in enumerate(WNIDS, 1)))
    out = str(tmp_path / 'sorted')
    tool.main([val, '--labels', str(labels), '--out', out, '--copy'])
    check_sorted(out)
    assert len(os.listdir(val)) == len(WNIDS)


def test_devkit_ground_truth(tmp_path, load_tool):
    """``meta.mat`` maps the ILSVRC IDs of the ground truth to wnids; only
    leaf synsets are classes."""
    scipy_io = pytest.importorskip('scipy.io')
    tool = load_tool('sort_imagenet_val')
    val = flat_val(str(tmp_path / 'val'))
    devkit = tmp_path / 'ILSVRC2012_devkit_t12'
    (devkit / 'data').mkdir(parents=True)
    ids = {'n01440764': 1, 'n01443537': 2, 'n15075141': 3}
    fields = [('ILSVRC2012_ID', 'O'), ('WNID', 'O'), ('words', 'O'),
              ('num_children', 'O')]
    synsets = np.array([(1, 'n01440764', 'tench', 0),
                        (2, 'n01443537', 'goldfish', 0),
                        (3, 'n15075141', 'toilet tissue', 0),
                        (4, 'n00001740', 'entity', 3)], dtype=fields)
    scipy_io.savemat(str(devkit / 'data' / 'meta.mat'),
                     {'synsets': synsets})
    (devkit / 'data' / tool.GROUND_TRUTH).write_text(
        ''.join(f'{ids[w]}\n' for w in WNIDS))
    tool.main([val, '--devkit', str(devkit)])
    check_sorted(val)


def test_refuses_before_moving_anything(tmp_path, load_tool):
    tool = load_tool('sort_imagenet_val')
    val = flat_val(str(tmp_path / 'val'))
    labels = tmp_path / 'val.txt'
    labels.write_text(''.join(f'{name(k)} {w}\n' for k, w in
                              enumerate(WNIDS + ['n01440764'], 1)))
    with pytest.raises(SystemExit, match='1 labelled images are neither'):
        tool.main([val, '--labels', str(labels)])
    assert len(os.listdir(val)) == len(WNIDS)  # all still flat
    labels.write_text(f'{name(1)} n01440764\n{name(2)} toilet\n')
    with pytest.raises(SystemExit, match=r'val\.txt:2: expected'):
        tool.main([val, '--labels', str(labels)])
    with pytest.raises(SystemExit, match='devkit file not found'):
        tool.main([val, '--devkit', str(tmp_path)])
