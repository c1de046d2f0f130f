"""Figure hp_sensitivity through ``tools/analysis/hp_sensitivity.py``: a
2 x 2 beta0 x gamma grid on a local Ray instance (tools/sweep.py) and the
baseline, on the first corruption of a tiny CIFAR-C stream; the files'
numbers against the runs' own results. It is also the test of a sweep of
classification configs (the segmentation ones: tests/tools/test_sweep.py)."""
import csv
import json
import os.path as osp
import sys

import pytest
import tool_runs
from cls_helpers import tiny_cifar_c
from seg_helpers import REPO

pytest.importorskip('ray', reason='the sweep extra: pip install -e '
                    "'.[sweep]'")

TOOL = osp.join(REPO, 'tools', 'analysis', 'hp_sensitivity.py')


def tiny_setup(tmp_path):
    root, ckpt = tiny_cifar_c(tmp_path)
    config = tmp_path / 'tiny_tent-stag.py'
    base = osp.join(REPO, 'configs/cls/cifar-c/cifar10-c_continual_wrn-28-10'
                    '_tent-stag.py')
    config.write_text(
        f"_base_ = [{base!r}]\n"
        "model = dict(network=dict(_delete_=True, type='SmallCNN', "
        "num_classes=4, width=4))\n"
        "test_dataloader = dict(batch_size=8, num_workers=0, dataset=dict("
        f"corruption_set=dict(data_root={str(root)!r}, n_examples=16), "
        "corruptions=['gaussian_noise', 'shot_noise']))\n")
    return str(config), ckpt


def test_grid_baseline_and_figure(tmp_path):
    config, ckpt = tiny_setup(tmp_path)
    work = tmp_path / 'sens'
    proc = tool_runs.run(
        [sys.executable, TOOL, config, ckpt, '--beta-grid', '1', '10',
         '--gamma-grid', '2', '20', '--optimum', '10', '20', '--num-cpus',
         '2', '--work-dir', str(work)], cwd=REPO, capture_output=True,
        text=True, timeout=900,
        env=dict(__import__('os').environ, OMP_NUM_THREADS='1',
                 CUDA_VISIBLE_DEVICES='', RAY_DEDUP_LOGS='0'))
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-5000:]
    out = json.load(open(work / 'hp_sensitivity.json'))
    assert out['score'] == 'acc' and out['optimum'] == [10.0, 20.0]
    assert len(out['grid']) == 4
    base = json.load(open(work / 'baseline' / 'continual_results.json'))
    assert [s['condition'] for s in base['stages']] == ['gaussian_noise']
    assert out['baseline'] == base['stages'][0]['score']
    sweep = json.load(open(work / 'sweep' / 'sweep_results.json'))['runs']
    for row in sweep:  # one stage each: the first corruption
        assert row['status'] == 'finished' and row['stages_done'] == 1
        # the sweep of classification configs: each row's accuracy is its
        # own tools/test.py run's, under the corruption's name
        with open(work / 'sweep' / 'runs' / row['name'] /
                  'continual_results.json') as f:
            assert row['r1 gaussian_noise'] == \
                json.load(f)['stages'][0]['score']
        point = next(g for g in out['grid']
                     if g['beta0'] == row['test_cfg.method.stag.beta0']
                     and g['gamma'] == row['test_cfg.method.stag.gamma'])
        assert point['score'] == row['acc_mean_over_stages']
    rows = list(csv.DictReader(open(work / 'hp_sensitivity.csv')))
    assert len(rows) == 4 and {r['beta0_over_opt'] for r in rows} == \
        {'0.1', '1.0'}
    assert (work / 'hp_sensitivity.png').stat().st_size > 20000


def test_config_without_stag_is_refused(tmp_path):
    config, ckpt = tiny_setup(tmp_path)
    plain = tmp_path / 'plain.py'
    plain.write_text(f"_base_ = [{config!r}]\n"
                     "test_cfg = dict(method=dict(stag=None))\n")
    proc = tool_runs.run(
        [sys.executable, TOOL, str(plain), ckpt, '--beta-grid', '1',
         '--gamma-grid', '2', '--work-dir', str(tmp_path / 'w')], cwd=REPO,
        capture_output=True, text=True)
    assert proc.returncode != 0
    assert 'has no test_cfg.method.stag' in proc.stderr
    assert not (tmp_path / 'w' / 'sweep').exists()  # before Ray starts
