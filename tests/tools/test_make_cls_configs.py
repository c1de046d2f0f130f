"""tools/make_cls_configs.py: the generated configs of ``configs/cls``
(what it writes, ``--check``) and that each of them loads with the paper's
settings. That the files on disk are the generator's output is checked in
tests/test_paper_hparams.py."""
import os
import os.path as osp

import pytest
from mmengine.config import Config

from mmseg_stag.classification import CLS_MODELS, CORRUPTIONS
from mmseg_stag.core import METHODS
from mmseg_stag.paper.hparams import PAPER_STAG, paper_stag
from mmseg_stag.paper.protocol import (BENCHMARK_DIRS, ECOTTA_ROWS,
                                       optimizer_for)
from mmseg_stag.paper.results import PAPER_RESULTS

REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))


@pytest.fixture
def tool(load_tool):
    """The generator script (its files, ``main``, ``write_configs``)."""
    return load_tool('make_cls_configs')


def test_one_config_per_implemented_row_and_a_source_per_setting(tool):
    files = tool.leaf_configs()
    rows = [r for r in PAPER_STAG if r[0] in BENCHMARK_DIRS]
    # the paper's baselines without a +STAG row: the baseline alone
    alone = [r[:4] for r in PAPER_RESULTS if r[0] in BENCHMARK_DIRS and
             r[3] != 'source' and r[:4] not in {s[:4] for s in rows}]
    assert sorted(alone) == [
        ('imagenet-c', s, m, 'tent') for s, m in (
            ('bs1', 'resnet50-gn'), ('label-shift', 'resnet50-gn'),
            ('mild', 'resnet50-gn'), ('mixed', 'resnet50-gn'),
            ('mixed', 'vit-b16'))]
    settings = {r[:3] for r in rows} | {r[:3] for r in alone}
    assert len(files) == 2 * len(rows) + len(alone) + len(settings)
    for b, s, m, method in alone:
        stem = f'{BENCHMARK_DIRS[b]}/{b}_{s}_{m}_{method}'
        assert "'../_base_/methods/tent.py'" in files[stem + '.py']
        assert stem + '-stag.py' not in files
    for b, s, m, method, beta0, gamma in rows:
        stem = f'{BENCHMARK_DIRS[b]}/{b}_{s}_{m}_{method.replace("_", "-")}'
        assert files[stem + '.py'].startswith(tool.HEADER)
        text = files[stem + '-stag.py']  # the baseline + the row's STAG
        assert text.startswith(tool.HEADER)
        assert f"_base_ = ['./{osp.basename(stem)}.py']\n" in text
        # BN Adapt's optimizer only with STAG (refused without)
        optim = (', optimizer=' + tool._fmt_dict(optimizer_for(b, s, m))
                 if method in tool.NO_LOSS else '')
        assert (f'test_cfg = dict(method=dict(stag=dict(beta0={beta0}, '
                f'gamma={gamma}){optim}))\n') in text
        assert ('optimizer=' in files[stem + '.py']) != bool(optim)
    for b, s, m in settings:
        assert f'{BENCHMARK_DIRS[b]}/{b}_{s}_{m}_source.py' in files
    for b, s, m, method, _, _ in rows:
        if method in ECOTTA_ROWS:  # EcoTTA's network, method and batch
            text = files[f'{BENCHMARK_DIRS[b]}/{b}_{s}_{m}_{method}.py']
            assert f"'../_base_/models/{m}_{method}.py'" in text
            assert "'../_base_/methods/ecotta.py'" in text
            assert 'test_dataloader = dict(batch_size=64)' in text


def test_main_writes_and_checks(tmp_path, capsys, tool):
    out = str(tmp_path / 'cls')
    assert tool.main([out, '--check']) == 1  # nothing there yet
    assert not osp.exists(out)  # --check writes nothing
    assert tool.main([out]) == 0
    written = sorted(osp.relpath(osp.join(d, n), out)
                     for d, _, names in os.walk(out) for n in names)
    assert written == sorted(tool.leaf_configs())
    assert tool.main([out, '--check']) == 0
    assert '0 config(s) differ' in capsys.readouterr().out
    # an edited file is reported, then rewritten
    path = osp.join(out, sorted(tool.leaf_configs())[0])
    with open(path, 'a', encoding='utf-8') as f:
        f.write('# edited\n')
    assert tool.write_configs(out, check=True) == [path]
    assert tool.main([out, '--check']) == 1
    assert path in capsys.readouterr().out
    assert tool.main([out]) == 0
    assert tool.write_configs(out, check=True) == []


def test_a_generated_file_whose_row_left_the_table_is_stale(tmp_path,
                                                           tool):
    out = str(tmp_path / 'cls')
    assert tool.main([out]) == 0
    stale = osp.join(out, 'cifar-c', 'cifar10-c_continual_wrn-28-10_old.py')
    hand_written = osp.join(out, 'cifar-c', 'my_own.py')
    with open(stale, 'w', encoding='utf-8') as f:
        f.write(tool.HEADER + "test_cfg = dict(method=dict(type='tent'))\n")
    with open(hand_written, 'w', encoding='utf-8') as f:
        f.write("method = dict(type='tent')\n")
    assert tool.write_configs(out, check=True) == [osp.normpath(stale)]
    assert osp.isfile(stale)  # --check removes nothing
    assert tool.write_configs(out) == [osp.normpath(stale)]
    assert not osp.exists(stale) and osp.isfile(hand_written)


def test_paper_hyper_parameters_in_configs(tool):
    cases = {
        'imagenet-c/imagenet-c_mild_resnet50-bn_tent.py': (100, 100, 2.5e-4),
        'imagenet-c/imagenet-c_mild_resnet50-gn_eata.py': (250, 100, 2.5e-4),
        'imagenet-c/imagenet-c_mild_vit-b16_tent.py': (300, 50, 1e-3),
        'imagenet-c/imagenet-c_bs1_vit-b16_sar.py': (1000, 10000,
                                                     0.001 / 64),
        'cifar-c/cifar10-c_continual_wrn-28-10_bn-adapt.py': (90, 15, 1e-3),
        'cifar-c/cifar10-c_continual_wrn-28-10_tent.py': (100, 10, 1e-3),
        'cifar-c/cifar100-c_continual_wrn-40-2_tent.py': (500, 5, 1e-3),
    }
    for rel, (beta0, gamma, lr) in cases.items():
        cfg = Config.fromfile(osp.join(REPO, 'configs', 'cls',
                                       rel.replace('.py', '-stag.py')))
        method = cfg.test_cfg.method
        assert (method.stag.beta0, method.stag.gamma) == (beta0, gamma), rel
        assert method.optimizer.lr == pytest.approx(lr), rel
        assert list(cfg.test_dataloader.dataset.corruptions) == \
            list(CORRUPTIONS)
    assert paper_stag('cifar100-c', 'continual', 'wrn-40-2',
                      'cotta') == dict(beta0=10, gamma=400)
    assert len(tool.leaf_configs()) >= 40


def test_every_cls_config_loads(tool):
    for rel in tool.leaf_configs():
        cfg = Config.fromfile(osp.join(REPO, 'configs', 'cls', rel))
        assert cfg.default_scope == 'mmseg_stag'
        assert cfg.model.type == 'OnlineClassifier'
        assert cfg.model.network.type in CLS_MODELS.module_dict
        assert cfg.test_cfg.type == 'OnlineAdaptationLoop'
        assert cfg.test_cfg.method.type in METHODS.module_dict, rel
        assert cfg.test_evaluator.type == 'StreamAccuracyMetric'
        assert cfg.test_dataloader.dataset.type == 'CorruptionStream'
        # Source keeps its BatchNorm statistics; the baselines use the
        # test batch's (their authors' code; BN Adapt always; EcoTTA by its
        # train() mode)
        batch_stats = cfg.test_cfg.method.type == 'bn_adapt' or (
            cfg.test_cfg.method.get('bn_batch_stats', False))
        assert batch_stats == (
            not rel.endswith('_source.py') and '_ecotta' not in rel), rel
