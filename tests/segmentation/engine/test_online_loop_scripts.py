"""The online loop from the command line, with the real configs shrunk by
``--cfg-options``: our ``tools/test.py``, MMSeg's own packaged test script
(configs run unchanged through ``custom_imports``) and the distributed guard
under ``torchrun`` with two CPU ranks. Subprocesses are slow: each script
runs once per module and its results are shared by the tests."""
import glob
import json
import os.path as osp
import re
import sys

import pytest
import torch
from seg_helpers import (REPO, SEG_CFG, as_cli, free_port, mmseg_test_py,
                         python_path, run_script, tiny_options)

from mmseg_stag.engine.launch_guard import DISTRIBUTED_ERROR

TENT_STAG = osp.join(REPO, SEG_CFG.format('tent-stag'))
STAGES = ['fog', 'night', 'rain', 'snow'] * 2

# Two CPU ranks for MMEngine's pytorch launcher on any machine: MMEngine's
# init_dist calls torch.cuda.set_device(LOCAL_RANK) and the Runner wraps the
# model in DDP with device_ids=[LOCAL_RANK], which a CPU build of PyTorch (or
# a single GPU) refuses. Only the torchrun test of MMSeg's script puts this
# on PYTHONPATH.
CPU_RANKS_SITECUSTOMIZE = '''\
import torch
import torch.nn.parallel as parallel

torch.cuda.is_available = lambda: False
torch.cuda.set_device = lambda device: None
_ddp_init = parallel.DistributedDataParallel.__init__


def _cpu_ddp_init(self, *args, **kwargs):
    kwargs.pop('device_ids', None)
    _ddp_init(self, *args, **kwargs)


parallel.DistributedDataParallel.__init__ = _cpu_ddp_init
'''


#: MMSeg's own packaged test script
MMSEG_TEST_PY = mmseg_test_py()


def stage_results(work_dir):
    with open(osp.join(work_dir, 'continual_results.json')) as f:
        return json.load(f)


@pytest.fixture(scope='module')
def tools_run(tiny_acdc, tiny_checkpoint, tmp_path_factory):
    """``tools/test.py`` on TENT+STAG, two rounds."""
    work_dir = tmp_path_factory.mktemp('tools_test')
    proc = run_script(
        [sys.executable, osp.join(REPO, 'tools/test.py'), TENT_STAG,
         tiny_checkpoint, '--work-dir', str(work_dir), '--cfg-options'] +
        as_cli(tiny_options(tiny_acdc, rounds=2)), cwd=REPO)
    return proc, work_dir


@pytest.fixture(scope='module')
def mmseg_run(tiny_acdc, tiny_checkpoint, tmp_path_factory):
    """MMSeg's packaged ``tools/test.py`` on the same config and options:
    the config's ``custom_imports`` brings the loop, the dataset and the
    metric; MMEngine loads the checkpoint (``load_from``)."""
    assert osp.isfile(MMSEG_TEST_PY), MMSEG_TEST_PY
    work_dir = tmp_path_factory.mktemp('mmseg_test')
    proc = run_script(
        [sys.executable, MMSEG_TEST_PY, TENT_STAG, tiny_checkpoint,
         '--work-dir', str(work_dir), '--cfg-options'] +
        as_cli(tiny_options(tiny_acdc, rounds=2)), cwd=str(work_dir))
    return proc, work_dir


def test_tools_test_py_end_to_end(tools_run):
    proc, work_dir = tools_run
    assert proc.returncode == 0, proc.stderr[-3000:]
    for name in ('continual_results.json', 'continual_results.csv',
                 'continual_miou.png', 'continual_results.partial.jsonl'):
        assert (work_dir / name).is_file(), name
    results = stage_results(work_dir)
    stages = results['stages']
    assert [s['stage'] for s in stages] == list(range(8))
    assert [s['condition'] for s in stages] == STAGES
    assert [s['round'] for s in stages] == [1] * 4 + [2] * 4
    assert [s['num_images'] for s in stages] == [2] * 8
    assert len(stages[0]['details']['per_class_IoU']) == 19
    assert results['mean_over_stages'] == pytest.approx(
        sum(s['score'] for s in stages) / 8)
    csv_rows = (work_dir / 'continual_results.csv').read_text().splitlines()
    assert len(csv_rows) == 9
    partial = (work_dir / 'continual_results.partial.jsonl').read_text()
    assert [json.loads(line)['stage'] for line in partial.splitlines()] == \
        list(range(8))
    # the table and the adaptation log lines reach the user
    log = proc.stdout + proc.stderr
    assert 'Round |    fog |  night |   rain |   snow' in log
    iters = re.findall(r'Iter\(test\) \[\s*(\d+)/16\].*', log)
    assert sorted(set(map(int, iters))) == list(range(1, 17))
    for line in re.findall(r'Iter\(test\) \[\s*\d+/16\].*', log):
        for key in ('loss: ', 'loss_stag: ', 'beta: '):
            assert key in line, (key, line)
    assert 'online adaptation: 16 update steps' in log


def test_mmseg_test_script_runs_the_configs_unchanged(mmseg_run, tools_run,
                                                      tiny_checkpoint):
    # MMEngine's loader reads the checkpoint with torch's safe loader
    checkpoint = torch.load(tiny_checkpoint, weights_only=True)
    assert set(checkpoint) == {'state_dict', 'meta'}
    proc, work_dir = mmseg_run
    assert proc.returncode == 0, proc.stderr[-3000:]
    log = proc.stdout + proc.stderr
    assert f'Load checkpoint from {tiny_checkpoint}' in log
    assert 'online adaptation: 16 update steps' in log
    stages = stage_results(work_dir)['stages']
    # one result per stage of the stream
    assert [s['stage'] for s in stages] == list(range(8))
    assert [s['condition'] for s in stages] == STAGES
    assert [s['num_images'] for s in stages] == [2] * 8
    # same seed, same stream, same weights: the same numbers as ours
    ours = stage_results(tools_run[1])['stages']
    assert [s['score'] for s in stages] == [s['score'] for s in ours]
    assert [s['details'] for s in stages] == [s['details'] for s in ours]


@pytest.mark.parametrize('script', ['ours', 'mmseg'])
def test_distributed_guard_with_two_cpu_ranks(script, tiny_acdc,
                                              tiny_checkpoint, tmp_path):
    """Ours stops before MMEngine starts the process group; MMSeg's own
    script reaches the loop, whose guard stops both ranks (MMEngine's
    launcher needs CUDA: a sitecustomize shim makes the ranks CPU ranks)."""
    env = {}
    if script == 'ours':
        test_py = osp.join(REPO, 'tools/test.py')
    else:
        shim = tmp_path / 'shim'
        shim.mkdir()
        (shim / 'sitecustomize.py').write_text(CPU_RANKS_SITECUSTOMIZE)
        env['PYTHONPATH'] = python_path(str(shim))
        test_py = MMSEG_TEST_PY
    torchrun = osp.join(osp.dirname(sys.executable), 'torchrun')
    work_dir = tmp_path / 'wd'
    proc = run_script(
        [torchrun, '--nproc_per_node', '2', '--master_port',
         str(free_port()), test_py,
         osp.join(REPO, SEG_CFG.format('tent')), tiny_checkpoint,
         '--launcher', 'pytorch', '--work-dir', str(work_dir),
         '--cfg-options'] + as_cli(tiny_options(tiny_acdc, rounds=1)) +
        ['env_cfg.dist_cfg.backend=gloo'],
        cwd=REPO, **env)
    log = proc.stdout + proc.stderr
    assert proc.returncode != 0, log[-3000:]
    assert DISTRIBUTED_ERROR.format(n=2) in log, log[-3000:]
    # both ranks stopped at the guard, before the stream
    assert log.count('cannot be split across 2 ranks') >= 2
    assert 'Iter(test)' not in log
    assert not glob.glob(osp.join(str(work_dir), '**',
                                  'continual_results*.json*'),
                         recursive=True)
