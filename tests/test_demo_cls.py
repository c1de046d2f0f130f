"""``make demo-cls`` (tools/demo_cls.py), reduced: real MNIST digits, the 15
corruptions, a trained source model, STAG selection and the table."""
import json
import os
import os.path as osp
import subprocess
import sys

from conftest import REPO

ARGS = ['--n-test', '30', '--nets', 'bn', '--scenarios', 'mild',
        '--methods', 'tent', 'eata', '--epochs', '1', '--beta-grid', '10',
        '50', '--gamma-grid', '10', '--workers', '1']


def run_demo(work_dir):
    proc = subprocess.run(
        [sys.executable, osp.join(REPO, 'tools/demo_cls.py'), '--work-dir',
         str(work_dir)] + ARGS, capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return proc.stdout


def test_reduced_demo_cls_runs_and_resumes(tmp_path):
    out = run_demo(tmp_path)
    summary = json.load(open(tmp_path / 'summary.json'))
    setting = summary['settings']['mild_bn']
    # --methods keeps TENT and EATA among the mild scenario's baselines
    assert [r['name'] for r in setting['rows']] == [
        'Source', 'TENT', 'TENT+STAG', 'EATA', 'EATA+STAG']
    corruptions = json.load(open(tmp_path / 'mild_bn' /
                                 'results.json'))['corruptions']
    assert len(corruptions) == 15
    for row in setting['rows']:
        assert list(row['per_corruption']) == corruptions
        assert all(c['total'] == 30 for c in row['per_corruption'].values())
    # a 1-epoch model is rarely confident enough for EATA's entropy filter,
    # but +STAG updates on every batch (L_STAG covers all samples)
    eata, eata_stag = setting['rows'][3:]
    assert eata['num_updates'] <= eata_stag['num_updates'] == 15
    # beta0/gamma chosen from the grid on the first corruption only
    assert setting['choices']['TENT']['beta0'] in (10, 50)
    assert len(setting['choices']['TENT']['trials']) == 2
    for f in ('summary.md', 'mild_bn/results.csv', 'mild_bn/results.txt',
              'data/MNIST-C/gaussian_noise.npy', 'models/bn.pth'):
        assert osp.isfile(tmp_path / f), f
    assert 'Mild, CNN-BN (accuracy %)' in out
    # a second run reuses the data, the model and every finished row
    stamp = os.stat(tmp_path / 'data/MNIST-C/labels.npy').st_mtime_ns
    again = run_demo(tmp_path)
    assert 'cached' in again
    assert os.stat(tmp_path / 'data/MNIST-C/labels.npy').st_mtime_ns == stamp
    rows2 = json.load(open(tmp_path / 'summary.json'))['settings'][
        'mild_bn']['rows']
    assert [r['per_corruption'] for r in rows2] == \
        [r['per_corruption'] for r in setting['rows']]


def test_demo_cls_rejects_bad_options(tmp_path):
    for bad, message in ((['--n-test', '0'], '--n-test'),
                         (['--n-test', '4000'], '--n-test'),
                         (['--epochs', '0'], '--epochs'),
                         (['--gamma-grid', '0'], '--gamma-grid')):
        proc = subprocess.run(
            [sys.executable, osp.join(REPO, 'tools/demo_cls.py'),
             '--work-dir', str(tmp_path)] + bad,
            capture_output=True, text=True, cwd=REPO)
        assert proc.returncode == 2 and message in proc.stderr, bad
    assert not os.listdir(tmp_path)  # nothing written
