"""``demo_data/acdc_layout.py``: the ACDC-layout writer of the tests and
demos is deterministic and writes the real formats."""
import filecmp
import os
import os.path as osp

import numpy as np
import pytest
from PIL import Image

from demo_data import make_acdc_like_tree


def tree_files(root):
    return sorted(osp.relpath(osp.join(d, n), root)
                  for d, _, ns in os.walk(root) for n in ns)


def test_layout_writer_is_deterministic(tmp_path):
    a = make_acdc_like_tree(str(tmp_path / 'a'), images_per_condition=2,
                            seed=5)
    b = make_acdc_like_tree(str(tmp_path / 'b'), images_per_condition=2,
                            seed=5)
    c = make_acdc_like_tree(str(tmp_path / 'c'), images_per_condition=2,
                            seed=6)
    files = tree_files(a)
    assert files == tree_files(b) == tree_files(c)
    assert len(files) == 4 * 2 * 2
    # the defaults write the same layout (2 images a condition)
    assert tree_files(make_acdc_like_tree(str(tmp_path / 'd'))) == files
    for f in files:
        with open(osp.join(a, f), 'rb') as fa, open(osp.join(b, f),
                                                    'rb') as fb:
            assert fa.read() == fb.read(), f
    assert not all(
        filecmp.cmp(osp.join(a, f), osp.join(c, f), shallow=False)
        for f in files)


def test_layout_writer_formats(tmp_path):
    root = make_acdc_like_tree(str(tmp_path / 't'), conditions=('night', ),
                               images_per_condition=2, size=(5, 3))
    files = tree_files(root)
    imgs = [f for f in files if f.startswith('rgb_anon')]
    gts = [f for f in files if f.startswith('gt')]
    assert len(imgs) == len(gts) == 2
    for f in imgs:
        im = Image.open(osp.join(root, f))
        assert im.mode == 'RGB' and im.size == (5, 3)
    for f in gts:
        im = Image.open(osp.join(root, f))
        assert im.mode == 'L' and im.size == (5, 3)
        arr = np.array(im)
        assert arr.dtype == np.uint8
        assert 255 in arr  # even a tiny map has ignore pixels
        assert set(np.unique(arr)) <= set(range(19)) | {255}
    with pytest.raises(ValueError):
        make_acdc_like_tree(str(tmp_path / 'x'), images_per_condition=0)
