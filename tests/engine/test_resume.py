"""Resume and reproducibility of an online run through ``tools/test.py``:
a run SIGKILLed mid-stream and resumed equals the uninterrupted run (per
stage mIoU and final parameters, CoTTA's teacher and restore randomness
included); resume refuses another run's work dir and a corrupt state file;
two runs with the same seed agree exactly."""
import hashlib
import json
import os.path as osp
import signal
import sys

import pytest
import torch
from run_helpers import killable_config, numbers
from seg_helpers import (REPO, SEG_CFG, as_cli, eata_source_options,
                         python_path, run_script, tiny_options)

from mmseg_stag.engine.run_state import STATE_FILE

#: CoTTA on the tiny stream: 6 views, and restores often enough to matter
COTTA = {'test_dataloader.dataset.pipeline.1.scale': (128, 64),
         'test_dataloader.dataset.pipeline.1.ratios': [0.5, 1.0, 1.5],
         'test_cfg.method.restore_prob': 0.5}
KILL = '3,2'  # before the 2nd batch of the 4th stage (3 stages saved)


def run_test_py(config, checkpoint, work_dir, opts, *extra, kill=None):
    env = dict(PYTHONPATH=python_path(osp.join(REPO, 'tests')))
    if kill:
        env['KILL_AT_STAGE'] = kill
    return run_script(
        [sys.executable, osp.join(REPO, 'tools/test.py'), config, checkpoint,
         '--work-dir', str(work_dir), '--save-adapted',
         osp.join(str(work_dir), 'adapted.pth'), *extra, '--cfg-options']
        + as_cli(opts), cwd=REPO, **env)


def results(work_dir, provenance=False):
    """The run's numbers (``provenance``: its whole record)."""
    with open(osp.join(str(work_dir), 'continual_results.json')) as f:
        record = json.load(f)
    return record if provenance else numbers(record)


def final_state(work_dir):
    return torch.load(osp.join(str(work_dir), STATE_FILE), weights_only=True)


def assert_tensors_equal(a, b):
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key


@pytest.mark.parametrize('method', ['tent-stag', 'cotta-stag', 'eata-stag'])
def test_killed_run_resumes_to_the_uninterrupted_result(
        method, tiny_acdc, tiny_cityscapes, confident_checkpoint, tmp_path):
    opts = tiny_options(tiny_acdc, rounds=2)
    if method.startswith('cotta'):
        opts.update(COTTA)
    elif method.startswith('eata'):  # its Fisher: restored, not refitted
        opts.update(eata_source_options(tiny_cityscapes))
    else:  # the real configs' loader: worker processes (resumed mid-stream)
        opts.update({'test_dataloader.num_workers': 2,
                     'test_dataloader.persistent_workers': True})
    tiny_checkpoint = confident_checkpoint
    config = killable_config(osp.join(REPO, SEG_CFG.format(method)), {},
                             tmp_path, name=f'{method}_killable.py')
    whole, cut = tmp_path / 'whole', tmp_path / 'cut'
    proc = run_test_py(config, tiny_checkpoint, whole, opts)
    assert proc.returncode == 0, proc.stderr[-4000:]

    proc = run_test_py(config, tiny_checkpoint, cut, opts, kill=KILL)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]
    saved = torch.load(osp.join(str(cut), STATE_FILE), weights_only=True)
    assert saved['batches_done'] == 6  # 3 stages of 2 images
    with open(osp.join(str(cut), 'continual_results.partial.jsonl')) as f:
        assert len(f.readlines()) == 3
    assert not osp.exists(osp.join(str(cut), 'continual_results.json'))

    proc = run_test_py(config, tiny_checkpoint, cut, opts, '--resume')
    assert proc.returncode == 0, proc.stderr[-4000:]
    log = proc.stdout + proc.stderr
    assert 'resumed from' in log and '6 of 16 batches done' in log
    assert 'Iter(test) [ 7/16]' in log and 'Iter(test) [ 6/16]' not in log

    expected, got = results(whole), results(cut)
    assert [s['score'] for s in got['stages']] == \
        [s['score'] for s in expected['stages']]
    assert got == expected
    # the provenance tells them apart: the cut run was resumed
    whole_run, cut_run = (results(w, provenance=True)['provenance']
                          for w in (whole, cut))
    assert (whole_run['resumed'], whole_run['resumed_at_batch']) == (
        False, None)
    assert (cut_run['resumed'], cut_run['resumed_at_batch']) == (True, 6)
    assert (whole_run['images'], cut_run['images']) == (16, 10)
    assert_tensors_equal(
        torch.load(osp.join(str(whole), 'adapted.pth'),
                   weights_only=True)['state_dict'],
        torch.load(osp.join(str(cut), 'adapted.pth'),
                   weights_only=True)['state_dict'])
    a, b = final_state(whole)['method'], final_state(cut)['method']
    assert_tensors_equal(a['model'], b['model'])
    if method.startswith('cotta'):
        assert_tensors_equal(a['teacher'], b['teacher'])
    if method.startswith('eata'):
        assert 'statistics of' not in log  # no second Fisher pass
        assert torch.equal(a['model_probs'], b['model_probs'])
        for name, (fisher, theta) in a['fishers'].items():
            assert torch.equal(fisher, b['fishers'][name][0]), name
        assert a['num_samples_update_2'] == b['num_samples_update_2'] > 0
    assert a['num_updates'] == b['num_updates'] == 16


@pytest.fixture(scope='module')
def finished_run(tiny_acdc, tiny_checkpoint, tmp_path_factory):
    """A finished one-round TENT+STAG run (its work dir and options)."""
    work_dir = tmp_path_factory.mktemp('finished')
    opts = tiny_options(tiny_acdc, rounds=1)
    config = osp.join(REPO, SEG_CFG.format('tent-stag'))
    proc = run_test_py(config, tiny_checkpoint, work_dir, opts, '--seed', '3',
                   '--deterministic')
    assert proc.returncode == 0, proc.stderr[-4000:]
    return work_dir, opts, config


def md5(path):
    with open(path, 'rb') as f:
        return hashlib.md5(f.read()).hexdigest()


def test_same_seed_same_numbers(finished_run, tiny_checkpoint, tmp_path):
    work_dir, opts, config = finished_run
    proc = run_test_py(config, tiny_checkpoint, tmp_path, opts, '--seed', '3',
                   '--deterministic')
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert results(tmp_path) == results(work_dir)
    assert_tensors_equal(final_state(tmp_path)['method']['model'],
                         final_state(work_dir)['method']['model'])


def test_resume_of_a_finished_run_writes_the_same_results(
        finished_run, tiny_checkpoint):
    work_dir, opts, config = finished_run
    before = results(work_dir)
    proc = run_test_py(config, tiny_checkpoint, work_dir, opts, '--seed', '3',
                   '--deterministic', '--resume')
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert '8 of 8 batches done' in proc.stdout + proc.stderr
    assert results(work_dir) == before


def test_resume_refuses_another_config_or_checkpoint(
        finished_run, tiny_checkpoint, tmp_path):
    work_dir, opts, config = finished_run
    state = osp.join(str(work_dir), STATE_FILE)
    before = md5(state)
    other = dict(opts, **{'test_cfg.method.stag.beta0': 7.0})
    proc = run_test_py(config, tiny_checkpoint, work_dir, other, '--seed', '3',
                   '--deterministic', '--resume')
    assert proc.returncode != 0
    assert 'written by another run' in proc.stderr
    assert 'test_cfg.method.stag.beta0: 500.0 -> 7.0' in proc.stderr
    proc = run_test_py(config, tiny_checkpoint, work_dir, opts, '--seed', '4',
                   '--deterministic', '--resume')
    assert 'randomness.seed: 3 -> 4' in proc.stderr, proc.stderr[-2000:]

    ckpt = torch.load(tiny_checkpoint, weights_only=True)
    ckpt['state_dict']['decode_head.conv_seg.bias'] += 1.0
    changed = tmp_path / 'other.pth'
    torch.save(ckpt, changed)
    proc = run_test_py(config, str(changed), work_dir, opts, '--seed', '3',
                   '--deterministic', '--resume')
    assert proc.returncode != 0
    assert 'the starting weights (checkpoint)' in proc.stderr
    assert md5(state) == before  # nothing overwritten


def test_resume_refuses_a_corrupt_state_file(finished_run, tiny_checkpoint,
                                             tmp_path):
    work_dir, opts, config = finished_run
    cut = tmp_path / 'cut'
    cut.mkdir()
    with open(osp.join(str(work_dir), STATE_FILE), 'rb') as f:
        data = f.read()
    state = cut / STATE_FILE
    state.write_bytes(data[:len(data) // 2])  # truncated
    proc = run_test_py(config, tiny_checkpoint, cut, opts, '--seed', '3',
                   '--deterministic', '--resume')
    assert proc.returncode != 0
    assert 'corrupt or truncated' in proc.stderr, proc.stderr[-2000:]
    assert str(state) in proc.stderr
    assert state.read_bytes() == data[:len(data) // 2]
    assert not osp.exists(cut / 'continual_results.partial.jsonl')


def test_resume_without_a_previous_run(tiny_checkpoint, tiny_acdc, tmp_path):
    proc = run_test_py(osp.join(REPO, SEG_CFG.format('tent')), tiny_checkpoint,
                   tmp_path, tiny_options(tiny_acdc), '--resume')
    assert proc.returncode != 0
    assert '--resume: no previous run in' in proc.stderr
    assert 'Iter(test)' not in proc.stdout + proc.stderr
