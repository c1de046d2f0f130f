"""``tools/sweep.py``: four tiny runs (two methods x two beta0) on a local
Ray instance with two CPU workers, one of them killed mid-way (reported as
failed, the others finish, one table and one figure gather them); and the
bad inputs refused before Ray starts."""
import json
import os
import os.path as osp
import signal
import subprocess
import sys
import time

import pytest
import tool_runs
from seg_helpers import REPO, SEG_CFG, as_cli, tiny_options

ray = pytest.importorskip('ray', reason='the sweep extra: pip install -e '
                          "'.[sweep]' (tools/install_env.sh installs it)")

SWEEP = osp.join(REPO, 'tools', 'sweep.py')
TENT, BN = (osp.join(REPO, SEG_CFG.format(m))
            for m in ('tent-stag', 'bn-adapt-stag'))
GRID = 'test_cfg.method.stag.beta0=100,500'


def sweep_cmd(work_dir, checkpoint, *extra, configs=(TENT, BN)):
    cmd = [sys.executable, SWEEP, '--work-dir', str(work_dir)]
    for config in configs:
        cmd += ['--run', config, checkpoint]
    return cmd + list(extra)


def env():
    return dict(os.environ, OMP_NUM_THREADS='1', CUDA_VISIBLE_DEVICES='',
                RAY_DEDUP_LOGS='0')


def test_sweep_on_local_ray_with_a_killed_run(tiny_acdc, tiny_checkpoint,
                                              tmp_path):
    work = tmp_path / 'sweep'
    cmd = sweep_cmd(work, tiny_checkpoint, '--grid', GRID, '--num-cpus',
                    '2', '--cfg-options',
                    *as_cli(tiny_options(tiny_acdc, rounds=1)))
    proc = subprocess.Popen(cmd, cwd=REPO, env=env(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    victim = ('segformer_mit-b5_acdc-continual_bn-adapt-stag@tiny_segformer,'
              'beta0=500,seed=0')
    pid_file = work / 'runs' / victim / 'pid'
    deadline = time.time() + 600
    while not pid_file.exists() and proc.poll() is None:
        assert time.time() < deadline
        time.sleep(0.2)
    time.sleep(0.2)  # the pid is written right after the run started
    os.kill(int(pid_file.read_text()), signal.SIGKILL)
    out, _ = proc.communicate(timeout=900)
    assert proc.returncode == 0, out[-5000:]

    with open(work / 'sweep_results.json') as f:
        rows = {r['name']: r for r in json.load(f)['runs']}
    assert len(rows) == 4
    assert rows[victim]['status'].startswith('failed:'), rows[victim]
    assert 'killed by signal 9' in rows[victim]['status']
    for name, row in rows.items():
        if name != victim:
            assert row['status'] == 'finished', row
            assert row['stages_done'] == 4
            assert row['mIoU_mean_over_stages'] is not None
            assert {'r1 fog', 'r1 snow', 'mean night'} <= set(row)
    assert {row['test_cfg.method.stag.beta0'] for row in rows.values()} == \
        {100, 500}
    # each finished run's numbers are its own tools/test.py results
    for name, row in rows.items():
        if name != victim:
            with open(work / 'runs' / name / 'continual_results.json') as f:
                assert row['r1 fog'] == json.load(f)['stages'][0]['score']
    for ext in ('csv', 'md', 'png'):
        assert (work / f'sweep_results.{ext}').stat().st_size > 0
    assert 'failed' in (work / 'sweep_results.md').read_text()


def run_quick(cmd):
    return tool_runs.run(cmd, cwd=REPO, env=env(), capture_output=True,
                          text=True, timeout=300)


def test_unknown_grid_key_is_refused_before_ray(tiny_checkpoint, tmp_path,
                                                load_tool):
    proc = run_quick(sweep_cmd(tmp_path, tiny_checkpoint, '--grid',
                               'test_cfg.method.stag.beta_0=1,2'))
    assert proc.returncode != 0
    assert "--grid key 'test_cfg.method.stag.beta_0' is not a setting" in \
        proc.stderr
    assert "test_cfg.method.stag has no 'beta_0'" in proc.stderr
    assert 'Started a local Ray instance' not in proc.stdout + proc.stderr
    # an argument the method takes at its default is a setting
    from mmengine.config import Config
    check_key = load_tool('sweep').check_key
    cfg = Config.fromfile(TENT).to_dict()
    assert check_key(cfg, 'test_cfg.method.optimizer.lr') is None
    assert check_key(cfg, 'test_cfg.method.stage_restart') is None
    assert check_key(cfg, 'test_cfg.method.loss') is None
    assert 'has no' in check_key(cfg, 'test_cfg.method.no_such_option')


def test_silent_ray_address_is_refused(tiny_checkpoint, tmp_path):
    proc = run_quick(sweep_cmd(tmp_path, tiny_checkpoint, '--address',
                               '127.0.0.1:9'))
    assert proc.returncode != 0
    assert 'the Ray cluster at --address 127.0.0.1:9 does not answer' in \
        proc.stderr


def test_missing_files_and_no_runs(tiny_checkpoint, tmp_path):
    proc = run_quick(sweep_cmd(tmp_path, str(tmp_path / 'nope.pth')))
    assert 'file not found' in proc.stderr and 'nope.pth' in proc.stderr
    proc = run_quick([sys.executable, SWEEP, '--work-dir', str(tmp_path)])
    assert 'no run' in proc.stderr


def test_without_ray_the_command_says_how_to_install_it(tiny_checkpoint,
                                                        tmp_path):
    code = ("import sys, runpy; sys.modules['ray'] = None; "
            f"sys.argv = {sweep_cmd(tmp_path, tiny_checkpoint)[1:]!r}; "
            f"runpy.run_path({SWEEP!r}, run_name='__main__')")
    proc = run_quick([sys.executable, '-c', code])
    assert proc.returncode != 0
    assert "pip install -e '.[sweep]'" in proc.stderr


# -- what a run asks Ray for, and the environment its process gets -------
@pytest.fixture
def planned(load_tool):
    """``planned(*argv)``: what each run of the sweep asks Ray for."""
    sweep = load_tool('sweep')

    def plan(*argv, cluster_gpus=0, node_cpus=64):
        args = sweep.parse_args(['--work-dir', 'w', '--run', TENT, 'x.pth',
                                 *argv])
        runs = sweep.expand_runs(args)
        sweep.plan_resources(runs, args, cluster_gpus, node_cpus)
        return [(r['cpus'], r['gpus']) for r in runs]

    return plan


def test_a_run_holds_a_cpu_per_process_it_starts(planned):
    """The main process plus its data workers (the ACDC configs: 4), from
    the config, --cfg-options or the grid; --cpus-per-run overrides."""
    assert planned() == [(5, 0)]
    assert planned('--cfg-options', 'test_dataloader.num_workers=0') == \
        [(1, 0)]
    assert planned('--grid', 'test_dataloader.num_workers=0,4') == \
        [(1, 0), (5, 0)]
    assert planned('--cpus-per-run', '2') == [(2, 0)]
    assert planned(cluster_gpus=8) == [(5, 1)]
    assert planned('--gpus-per-run', '0.5', cluster_gpus=8) == [(5, 0.5)]


def test_cpus_are_capped_to_a_node_or_refused_when_asked(planned):
    assert planned(node_cpus=2) == [(2, 0)]  # else Ray waits forever
    with pytest.raises(SystemExit, match='--cpus-per-run 4 exceeds the '
                       'CPUs of every Ray node'):
        planned('--cpus-per-run', '4', node_cpus=2)


def test_the_trial_asks_tune_for_its_run_resources(load_tool):
    trial_resources = load_tool('sweep').trial_resources
    request = trial_resources(dict(run=dict(cpus=3, gpus=1)))
    assert request.bundles == [{'CPU': 3, 'GPU': 1}]
    assert trial_resources(dict(run=dict(cpus=2, gpus=0))).bundles == \
        [{'CPU': 2}]


def test_the_run_gets_its_cpus_as_omp_threads_and_is_one_process(
        tmp_path, monkeypatch, load_tool):
    """Ray's worker has OMP_NUM_THREADS=1 (Ray's default, or the shell's)
    and, on a SLURM node started by ``srun -N 4 ray start``, the step's task
    count: the run gets its own CPUs and none of the launchers' counts."""
    sweep = load_tool('sweep')
    seen = {}

    class Done:
        pid, returncode = 1, 0

        def poll(self):
            return 0

    def popen(cmd, **kwargs):
        seen.update(kwargs['env'])
        return Done()

    monkeypatch.setattr(sweep.subprocess, 'Popen', popen)
    monkeypatch.setenv('OMP_NUM_THREADS', '1')
    monkeypatch.setenv('SLURM_STEP_NUM_TASKS', '4')
    monkeypatch.setenv('SLURM_PROCID', '2')
    monkeypatch.setenv('SLURM_JOB_ID', '7')
    run = dict(name='r', config='c.py', checkpoint='k.pth', seed=0,
               overrides={}, work_dir=str(tmp_path / 'r'), cpus=3, gpus=1)
    from mmseg_stag.engine.launch_guard import (LAUNCHER_VARIABLES,
                                                check_single_process)
    sweep.run_trial(dict(run=run, options=[], resume=False,
                         launcher_variables=list(LAUNCHER_VARIABLES)))
    assert seen['OMP_NUM_THREADS'] == '3'
    assert 'SLURM_STEP_NUM_TASKS' not in seen and 'SLURM_PROCID' not in seen
    assert seen['SLURM_JOB_ID'] == '7'  # everything else is inherited
    check_single_process(1, seen)  # the run's own guard lets it through
    assert sweep.child_env({}, 0.5, ())['OMP_NUM_THREADS'] == '1'


def test_a_trial_reads_the_partial_results_without_the_package(tmp_path):
    """The trial's reader is the report's own ``read_partial`` (loaded
    by its path, so the Ray worker imports no torch): whole lines up to a
    cut one."""
    code = (
        'import sys, runpy\n'
        f'sweep = runpy.run_path({SWEEP!r})\n'
        'read = sweep["partial_reader"]()\n'
        f'print(len(read({str(tmp_path)!r})))\n'
        'print(sorted(m for m in ("torch", "mmengine", "mmseg_stag")'
        ' if m in sys.modules))\n')
    from mmseg_stag.engine.report import PARTIAL_FILE, read_partial
    (tmp_path / PARTIAL_FILE).write_text(
        '{"score": 1.5, "condition": "fog"}\n{"score": 2}\n{"sco')
    proc = run_quick([sys.executable, '-c', code])
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split('\n')[:2] == ['2', '[]']
    assert read_partial(str(tmp_path)) == [
        {'score': 1.5, 'condition': 'fog'}, {'score': 2}]
