"""Shared fixtures: a tiny ACDC-layout dataset and a tiny SegFormer
checkpoint matching the real configs shrunk by ``--cfg-options`` (the
helpers live in ``seg_helpers.py`` and are re-exported here), and
``load_tool``: a script of ``tools/`` loaded by its path."""
import os

import pytest
import torch
from seg_helpers import (NVLABS_SEG_CFG, REPO, SEG_CFG,  # noqa: F401
                         TINY_IN_CHANNELS, TINY_MIT, as_cli, build_from_config,
                         build_segmentor, mit_backbone, save_checkpoint,
                         tiny_options)
#: the MJPEG stream fixture (tests/apis/test_frames.py, test_adapt_run.py)
from stream_helpers import serve  # noqa: F401
from tool_runs import tool_module

from demo_data import make_acdc_like_tree


def pytest_collection_modifyitems(config, items):
    """Tests marked ``cuda`` skip on a machine without a CUDA device (CI on
    the CPU collects them and reports why)."""
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason='no CUDA device')
    for item in items:
        if item.get_closest_marker('cuda') is not None:
            item.add_marker(skip)


#: One intra-op thread in every test process and in the tools they start
#: (they inherit the variable): the models are tiny and pytest-xdist's
#: workers already share the cores, so more threads only oversubscribe them
#: (OpenMP's waiting threads; an order of magnitude slower on a shared
#: machine for some tests, ~7 % of the suite's CPU time on 2 cores). A
#: value set in the shell is kept.
os.environ.setdefault('OMP_NUM_THREADS', '1')
torch.set_num_threads(int(os.environ['OMP_NUM_THREADS']))


@pytest.fixture
def load_tool():
    """``load_tool('sweep')``, ``load_tool('analysis/tsne')``: the script
    ``tools/<name>.py`` as a fresh module, for the tests of its own command
    line (``tools`` is no package: what scripts share lives in
    ``mmseg_stag``, or in ``benchmarks`` for the measuring tools)."""
    return tool_module


@pytest.fixture(scope='session')
def tiny_acdc(tmp_path_factory):
    root = tmp_path_factory.mktemp('acdc')
    return str(make_acdc_like_tree(str(root), images_per_condition=2,
                                   size=(96, 48), seed=0))


@pytest.fixture(scope='session')
def tiny_checkpoint(tmp_path_factory, tiny_acdc):
    """A tiny MMSeg-head SegFormer checkpoint (random, seeded) with BN
    statistics that are not the identity."""
    model, _ = build_from_config(SEG_CFG.format('source'),
                                 tiny_options(tiny_acdc))
    bn = model.decode_head.fusion_conv.bn
    bn.running_mean.uniform_(-0.2, 0.2)
    bn.running_var.uniform_(0.5, 1.5)
    path = tmp_path_factory.mktemp('ckpt') / 'tiny_segformer.pth'
    return save_checkpoint(model, path)


@pytest.fixture(scope='session')
def confident_checkpoint(tiny_checkpoint, tmp_path_factory):
    """The tiny checkpoint with a sharper classifier: the entropy filters
    keep some pixels and drop others (a random 19-class head is too
    uncertain for any of them)."""
    ckpt = torch.load(tiny_checkpoint, weights_only=True)
    for key in ('decode_head.conv_seg.weight', 'decode_head.conv_seg.bias'):
        ckpt['state_dict'][key] = ckpt['state_dict'][key] * 12.0
    path = tmp_path_factory.mktemp('confident') / 'tiny_confident.pth'
    torch.save(ckpt, path)
    return str(path)


@pytest.fixture(scope='session')
def tiny_cityscapes(tmp_path_factory):
    """Four clean images in Cityscapes' val layout (EATA's source data)."""
    import numpy as np

    from demo_data.acdc_layout import save_png
    root = tmp_path_factory.mktemp('cityscapes')
    rng = np.random.default_rng(0)
    for k in range(4):
        stem = f'aachen_{k:06d}_000019'
        save_png(str(root / 'leftImg8bit' / 'val' / 'aachen' /
                     f'{stem}_leftImg8bit.png'),
                 rng.integers(0, 256, (48, 96, 3), dtype=np.uint8))
        save_png(str(root / 'gtFine' / 'val' / 'aachen' /
                     f'{stem}_gtFine_labelTrainIds.png'),
                 rng.integers(0, 19, (48, 96), dtype=np.uint8))
    return str(root)
