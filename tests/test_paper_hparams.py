"""The paper's beta0/gamma table (``mmseg_stag/paper/hparams.py``) is the one
source of the numbers: the generated classification configs, the ACDC
configs and tools/benchmark.py's +STAG arm match it (the docs' β0/γ page
is generated from it: tests/test_docs.py)."""
import argparse
import glob
import os.path as osp

import pytest
import torch.nn as nn
from mmengine.config import Config
from seg_helpers import SEG_CFG, build_from_config, tiny_options

from benchmarks import step_benchmark as benchmark
from mmseg_stag.classification import OnlineClassifier
from mmseg_stag.core import METHODS
from mmseg_stag.paper.hparams import (OUR_STAG, PAPER_STAG,
                                      paper_hparams_markdown, paper_stag,
                                      stag_hparams)
from mmseg_stag.paper.protocol import BENCHMARK_DIRS, ECOTTA_ROWS

REPO = osp.dirname(osp.dirname(osp.abspath(__file__)))
ACDC = ('acdc', 'continual', 'segformer-b5')


def test_table_rows_and_lookup():
    keys = [r[:4] for r in PAPER_STAG]
    assert len(set(keys)) == len(keys)  # one row per setting
    for *key, beta0, gamma in PAPER_STAG:
        # method types are spelled as the registry spells them
        assert key[3] in METHODS.module_dict or key[3] in ECOTTA_ROWS
        assert paper_stag(*key) == dict(beta0=beta0, gamma=gamma)
        assert beta0 > 0 and gamma > 0
    assert paper_stag(*ACDC, 'tent') == dict(beta0=500, gamma=35)
    with pytest.raises(KeyError, match='appendix_hp'):
        paper_stag(*ACDC, 'sar')
    # the paper's row, else ours
    assert stag_hparams(*ACDC, 'tent') == dict(beta0=500, gamma=35)
    assert stag_hparams(*ACDC, 'bn_adapt') == dict(beta0=250, gamma=25)
    assert stag_hparams(*ACDC, 'hybrid_tta') == dict(beta0=500, gamma=35)
    with pytest.raises(KeyError, match='appendix_hp'):
        stag_hparams('acdc', 'mild', 'segformer-b5', 'tent')
    lines = paper_hparams_markdown().splitlines()
    assert len(lines) == 2 + len(PAPER_STAG)
    assert lines[2] == '| acdc | continual | segformer-b5 | bn_adapt | 250 ' \
        '| 25 |'


def test_generated_cls_configs_are_the_generators_output(load_tool):
    generator = load_tool('make_cls_configs')
    root = osp.join(REPO, 'configs', 'cls')
    assert generator.write_configs(root, check=True) == []
    # and no stale file of a row that left the table
    on_disk = {osp.relpath(p, root) for folder in set(BENCHMARK_DIRS.values())
               for p in glob.glob(osp.join(root, folder, '*.py'))}
    assert on_disk == set(generator.leaf_configs())


def test_cls_configs_use_the_table(load_tool):
    leaves = load_tool('make_cls_configs').leaf_configs()
    rows = [r for r in PAPER_STAG if r[0] in BENCHMARK_DIRS]
    assert len(rows) == len([r for r in leaves if r.endswith('-stag.py')])
    for b, s, m, method, beta0, gamma in rows:
        rel = (f'{BENCHMARK_DIRS[b]}/{b}_{s}_{m}_{method.replace("_", "-")}'
               '-stag.py')
        cfg = Config.fromfile(osp.join(REPO, 'configs', 'cls', rel))
        assert cfg.test_cfg.method.type == (
            'ecotta' if method in ECOTTA_ROWS else method), rel
        assert dict(cfg.test_cfg.method.stag) == dict(beta0=beta0,
                                                      gamma=gamma), rel


def test_acdc_configs_use_the_table():
    paths = sorted(glob.glob(osp.join(REPO, 'configs/stag_acdc/*-stag.py')))
    # the paper's row, else ours (OUR_STAG)
    table = {r[:4]: r[4:6] for r in [*OUR_STAG, *PAPER_STAG]}
    seen = set()
    for path in paths:
        cfg = Config.fromfile(path)
        method = cfg.test_cfg.method
        assert (method.stag.beta0, method.stag.gamma) == \
            table[(*ACDC, method.type)], path
        seen.add((osp.basename(path).split('_')[1], method.type))
    # MMSeg's and NVlabs' heads, each with every method
    assert seen == {(h, t) for h in ('mit-b5', 'mit-b5-nvlabs')
                    for t in ('tent', 'bn_adapt', 'cotta', 'eata', 'sar',
                              'deyo', 'hybrid_tta')}
    with pytest.raises(KeyError, match='appendix_hp'):
        paper_stag(*ACDC, 'cotta')  # not the paper's: ours, and said so


# --------------------------------------------- tools/benchmark.py's +STAG
# (its arms: benchmarks.step_benchmark)
class TinyClassifier(nn.Module):
    """Stands in for ResNet-50 / ViT-B/16: BN body and a linear ``fc``."""

    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4),
                                  nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                                  nn.Flatten())
        self.fc = nn.Linear(4, 5)

    def forward(self, x):
        return self.fc(self.body(x))


def tiny_segformer():
    """Stands in for the SegFormers: the ACDC config's SegFormer shrunk to
    the tests' tiny MiT, its decode head's 1x1 classifier
    ``decode_head.conv_seg``."""
    return build_from_config(SEG_CFG.format('source'),
                             tiny_options('unused'))[0]


class ArmsBuilt(Exception):
    pass


def test_benchmark_stag_arm_uses_the_table(monkeypatch):
    settings = {'b0': ACDC, 'b5': ACDC, 'b5-nvlabs': ACDC,
                'resnet50': ('imagenet-c', 'mild', 'resnet50-bn'),
                'vit-b16': ('imagenet-c', 'mild', 'vit-b16')}
    assert set(benchmark.SEG_MODELS) | set(benchmark.IMAGENET_MODELS) == \
        set(settings)
    monkeypatch.setattr(
        benchmark, 'build_model',
        lambda name, seed=0, root='.': (
            OnlineClassifier(dict(type=TinyClassifier))
            if name in benchmark.IMAGENET_MODELS else tiny_segformer()).eval())
    built = {}

    def capture(arms, steps, warmup, dtype=None):
        built.update(arms)
        raise ArmsBuilt  # the arms are what is checked: no step is run

    monkeypatch.setattr(benchmark, 'interleave', capture)
    for name, setting in settings.items():
        kinds = ('tent', 'eata') if name in benchmark.IMAGENET_MODELS else \
            ('tent', 'bn_adapt')
        for kind in kinds:
            built.clear()
            args = argparse.Namespace(methods=[kind], size=(8, 8),
                                      cls_size=8, batch_size=2, steps=1,
                                      warmup=0, skip_reference=True,
                                      mixed_precision=None)
            with pytest.raises(ArmsBuilt):
                benchmark.run_model(name, args, 'cpu')
            assert set(built) == {kind, f'{kind}+stag'}, (name, kind)
            assert built[kind][1].stag_cfg is None
            assert built[f'{kind}+stag'][1].stag_cfg == \
                paper_stag(*setting, kind), (name, kind)


@pytest.mark.parametrize('config, stage, images', [
    ('configs/stag_acdc/segformer_mit-b5-nvlabs_acdc-continual_tent-stag.py',
     {'rounds': 1, 'conditions': ['night']}, {'images_per_condition': 3}),
    ('configs/cls/cifar-c/cifar10-c_continual_wrn-28-10_cotta-stag.py',
     {'corruptions': ['night']}, {'corruption_set.n_examples': 3}),
])
def test_the_stream_dataset_says_how_to_keep_its_first_stage(config, stage,
                                                            images):
    from mmengine.config import Config

    from mmseg_stag.paper.protocol import (first_stage_cfg_options,
                                           images_per_stage_cfg_options)
    cfg = Config.fromfile(config)
    prefix = 'test_dataloader.dataset.'
    assert first_stage_cfg_options(cfg, 'night') == {
        prefix + k: v for k, v in stage.items()}
    assert images_per_stage_cfg_options(cfg, 3) == {
        prefix + k: v for k, v in images.items()}
    if 'conditions' in stage:  # ACDC: one condition given as a string
        cfg.test_dataloader.dataset.conditions = 'rain'
        assert first_stage_cfg_options(cfg)[prefix + 'conditions'] == [
            'rain']
    cfg.test_dataloader.dataset.type = 'CityscapesDataset'
    with pytest.raises(ValueError, match="type='CityscapesDataset' is not a "
                       'stream dataset'):
        first_stage_cfg_options(cfg)
