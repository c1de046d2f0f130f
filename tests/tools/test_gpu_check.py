"""tools/gpu_check.py without a GPU: it says so and exits non-zero before
running anything; its development mode (``--allow-cpu --quick``) runs the
whole pipeline on the CPU with tiny sizes and writes the one report
(Markdown + JSON) with every step and figure; the JUnit summary and the
precision switch on their own. No timing is asserted."""
import json
import os
import os.path as osp
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))


def run_gpu_check(*args):
    """The tool in a process of its own with CUDA hidden (the CPU path on
    any machine)."""
    env = dict(os.environ, CUDA_VISIBLE_DEVICES='', OMP_NUM_THREADS='1')
    return subprocess.run(
        [sys.executable, osp.join(REPO, 'tools/gpu_check.py'), *args],
        capture_output=True, text=True, cwd=REPO, env=env, timeout=600)


@pytest.fixture
def gpu_check(load_tool):
    """The command tools/gpu_check.py, loaded by its path."""
    return load_tool('gpu_check')


def test_without_cuda_it_says_so_and_runs_nothing(tmp_path):
    out = tmp_path / 'report'
    proc = run_gpu_check('--out-dir', str(out))
    assert proc.returncode == 2
    assert 'no GPU' in proc.stderr and 'Nothing was run' in proc.stderr
    assert not out.exists()


def test_quick_cpu_run_writes_the_report(tmp_path, gpu_check):
    out = tmp_path / 'report'
    proc = run_gpu_check('--allow-cpu', '--quick', '--out-dir', str(out))
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert 'all ok' in proc.stdout
    report = json.loads((out / 'gpu_check.json').read_text())
    env = report['environment']
    assert env['device'] == 'cpu' and env['torch'] == torch.__version__
    assert env['date'] and report['quick'] is True
    steps = {s['name']: s for s in report['steps']}
    assert list(steps) == list(gpu_check.STEPS)
    assert all(s['status'] == 'ok' and s['seconds'] >= 0
               for s in steps.values())
    assert report['total_minutes'] > 0 and report['budget_minutes'] == 20

    tests = steps['tests']['result']
    assert tests['passed_all'] and tests['failed'] == tests['errors'] == 0
    # CUDA hidden: the cuda tests are collected and skipped, saying why
    assert tests['skipped'] > 0 and tests['passed'] == 0
    assert set(tests['skip_reasons']) == {'no CUDA device'}
    assert osp.isfile(tests['log']) and osp.isfile(tests['junit'])

    rows = steps['step_cost']['result']['rows']
    # the SegFormer's three baselines, then the ResNet's TENT
    assert [(r['method'], r['precision']) for r in rows] == [
        ('tent', 'fp32'), ('cotta', 'fp32'), ('hybrid_tta', 'fp32'),
        ('tent', 'fp32')]
    assert rows[2]['settings'].startswith('batch 1, 128x64')
    for row in rows:
        assert set(row['arms']) == {row['method'], row['method'] + '+stag'}
        for arm in row['arms'].values():
            assert arm['step_ms'] > 0 and arm['images_per_s'] > 0
            assert arm['peak_rss_mb'] > 0
        for key in ('stag_time_share_pct', 'stag_term_ms',
                    'stag_memory_share_pct'):
            assert isinstance(row[key], float), key
        assert row['settings'] and row['batch'] in (1, 2)

    loader = steps['loader']['result']
    assert [r['workers'] for r in loader['rows']] == [1, 2]
    assert all(r['images'] == 8 and r['images_per_s'] > 0
               for r in loader['rows'])

    loop = steps['loop']['result']['methods']
    assert set(loop) == {'tent', 'tent-stag'}
    assert all(r['images'] == 3 and r['classifier_calls_per_image'] == 1
               for r in loop.values())

    profile = steps['profile']['result']
    for part in ('step', 'loop'):
        assert profile[part]['wall_ms'] > 0
        assert profile[part]['cuda_kernel_ms'] is None  # no CUDA here
        assert profile[part]['scalar_reads'] >= 0
    assert profile['loop']['loader_wait_wall_ms'] >= 0

    text = (out / 'gpu_check.md').read_text()
    for heading in ('# GPU check', '## Steps', '## CUDA tests',
                    '## Step cost: each baseline vs +STAG', '## Loader',
                    '## Whole loop', '## Profile (torch.profiler)'):
        assert heading in text, heading
    assert 'not a measurement' in text
    assert 'images/s' in text and 'peak allocated (MB)' in text


def test_junit_summary(tmp_path, gpu_check):
    xml = tmp_path / 'junit.xml'
    xml.write_text(
        '<testsuites><testsuite>'
        '<testcase classname="a" name="ok"><properties><property '
        'name="fp16" value="ran"/></properties></testcase>'
        '<testcase classname="a" name="bad"><failure message="boom"/>'
        '</testcase>'
        '<testcase classname="a" name="off"><skipped message="no CUDA '
        'device"/></testcase>'
        '<testcase classname="a" name="err"><error message="e"/></testcase>'
        '</testsuite></testsuites>')
    res = gpu_check.junit_summary(str(xml))
    assert (res['passed'], res['failed'], res['errors'], res['skipped']) \
        == (1, 1, 1, 1)
    assert res['skip_reasons'] == {'no CUDA device': 1}
    assert res['properties'] == [dict(test='a::ok', name='fp16',
                                      value='ran')]
    assert [f['test'] for f in res['failures']] == ['a::bad', 'a::err']


@pytest.mark.parametrize('name,tf32,dtype', [
    ('fp32', False, None), ('tf32', True, None),
    ('bf16', False, torch.bfloat16)])
def test_precision_switches_and_restores(name, tf32, dtype, gpu_check):
    """TF32 flags and the probe's forward-only autocast inside the block,
    the previous settings after it."""
    task = SimpleNamespace(probe=SimpleNamespace(autocast_dtype=None))
    flags = (torch.backends.cuda.matmul.allow_tf32,
             torch.backends.cudnn.allow_tf32)
    with gpu_check.precision(task, name):
        assert torch.backends.cuda.matmul.allow_tf32 is tf32
        assert torch.backends.cudnn.allow_tf32 is tf32
        assert task.probe.autocast_dtype is dtype
    assert (torch.backends.cuda.matmul.allow_tf32,
            torch.backends.cudnn.allow_tf32) == flags
    assert task.probe.autocast_dtype is None


def test_bad_counts_are_refused(capsys, gpu_check):
    with pytest.raises(SystemExit):
        gpu_check.parse_args(['--pairs', '0'])
    assert '--pairs must be >= 1' in capsys.readouterr().err
    with pytest.raises(SystemExit):
        gpu_check.parse_args(['--loop-images', '4', '--loop-warmup', '4'])
