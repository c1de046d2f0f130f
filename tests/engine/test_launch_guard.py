"""``engine.launch_guard``: a stream started as several processes is refused
whether MMEngine knows of them (world size > 1) or only the launcher does
(``srun -n 2``, ``mpirun -n 2``, ``torchrun`` with ``--launcher none``);
a single process inside a many-task allocation is not. The environments
are the variables each launcher sets (Slurm's ``env.c`` and ``mpi/pmi2``,
Open MPI, Hydra, torchrun)."""
import pytest

from mmseg_stag.engine.launch_guard import (ALLOW_ENV, DISTRIBUTED_ERROR,
                                            LAUNCHER_VARIABLES,
                                            check_single_process,
                                            launcher_evidence)

#: several processes of one job, each with --launcher none
MANY = {
    'torchrun --nproc-per-node 2, rank 0': (
        dict(WORLD_SIZE='2', RANK='0', LOCAL_RANK='0'), 'WORLD_SIZE=2'),
    'torchrun --nproc-per-node 2, rank 1': (
        dict(WORLD_SIZE='2', RANK='1', LOCAL_RANK='1'), 'RANK=1'),
    'torch.distributed.launch without --use-env (tools/test.py sets '
    'LOCAL_RANK from --local-rank)': (dict(LOCAL_RANK='1'), 'LOCAL_RANK=1'),
    'srun -n 2 inside sbatch -n 8 (srun rewrites SLURM_NTASKS)': (
        dict(SLURM_JOB_ID='7', SLURM_NTASKS='2', SLURM_NPROCS='2',
             SLURM_STEP_ID='0', SLURM_STEP_NUM_TASKS='2',
             SLURM_PROCID='0'), 'SLURM_STEP_NUM_TASKS=2'),
    'srun -n 2 --preserve-env, task 1 (SLURM_NTASKS left unset)': (
        dict(SLURM_JOB_ID='7', SLURM_STEP_ID='0', SLURM_STEP_NUM_TASKS='2',
             SLURM_PROCID='1'), 'SLURM_PROCID=1'),
    'srun --mpi=pmi2 -n 4': (
        dict(SLURM_STEP_NUM_TASKS='4', PMI_SIZE='4', PMI_RANK='3'),
        'PMI_SIZE=4'),
    'Open MPI mpirun -n 4': (
        dict(OMPI_COMM_WORLD_SIZE='4', OMPI_COMM_WORLD_RANK='0'),
        'OMPI_COMM_WORLD_SIZE=4'),
    'Intel MPI mpirun -n 2': (
        dict(PMI_SIZE='2', PMI_RANK='0', MPI_LOCALNRANKS='2',
             MPI_LOCALRANKID='0'), 'MPI_LOCALNRANKS=2'),
    'MVAPICH2 mpirun_rsh -np 2': (
        dict(MV2_COMM_WORLD_SIZE='2', MV2_COMM_WORLD_RANK='1'),
        'MV2_COMM_WORLD_SIZE=2'),
}

#: one process, though some variables count more
ONE = {
    'a plain shell': {},
    'tools/test.py itself (LOCAL_RANK=0 from --local-rank)':
        dict(LOCAL_RANK='0'),
    'the batch script of sbatch -n 8 (no srun)': dict(
        SLURM_JOB_ID='7', SLURM_NTASKS='8', SLURM_NPROCS='8',
        SLURM_TASKS_PER_NODE='8', SLURM_PROCID='0', SLURM_JOB_NUM_NODES='1',
        ENVIRONMENT='BATCH'),
    'a salloc -n 8 shell': dict(SLURM_JOB_ID='7', SLURM_NTASKS='8',
                                SLURM_NPROCS='8'),
    'srun -n 1 inside sbatch -n 8': dict(
        SLURM_JOB_ID='7', SLURM_NTASKS='1', SLURM_NPROCS='1',
        SLURM_STEP_ID='3', SLURM_STEP_NUM_TASKS='1', SLURM_PROCID='0'),
    'srun -n 1 --preserve-env inside sbatch -n 8': dict(
        SLURM_NTASKS='8', SLURM_STEP_NUM_TASKS='1', SLURM_PROCID='0'),
    'torchrun --nproc-per-node 1': dict(WORLD_SIZE='1', RANK='0',
                                        LOCAL_RANK='0'),
    'mpirun -n 1': dict(OMPI_COMM_WORLD_SIZE='1', OMPI_COMM_WORLD_RANK='0'),
    'values that are not numbers': dict(WORLD_SIZE='', RANK='x'),
}


@pytest.mark.parametrize('environ,variable', MANY.values(), ids=list(MANY))
def test_several_processes_are_refused_naming_the_variable(environ,
                                                           variable):
    with pytest.raises(RuntimeError) as err:
        check_single_process(1, environ)
    message = str(err.value)
    assert variable in message, message
    assert '--launcher none' in message and 'same work dir' in message
    assert 'tools/sweep.py' in message  # the way to run many streams
    assert f'{ALLOW_ENV}=1' in message  # the way out for a lone process


@pytest.mark.parametrize('environ', ONE.values(), ids=list(ONE))
def test_one_process_is_not_refused(environ):
    check_single_process(1, environ)
    assert launcher_evidence(environ) == ([], 1)


def test_evidence_counts_the_largest_size_or_says_several():
    found, n = launcher_evidence(dict(MPI_LOCALNRANKS='2', PMI_SIZE='8',
                                      PMI_RANK='5'))
    assert n == 8
    assert found == ['PMI_SIZE=8 (MPICH/Intel MPI)',
                     'MPI_LOCALNRANKS=2 (MPICH/Intel MPI, this node)',
                     'PMI_RANK=5 (MPICH/Intel MPI)']
    assert launcher_evidence(dict(SLURM_PROCID='1'))[1] == 'several'
    with pytest.raises(RuntimeError, match='started as several processes'):
        check_single_process(1, dict(SLURM_PROCID='1'))


def test_mmengine_world_size_is_refused_with_the_distributed_message():
    """World size > 1 splits the stream: refused even with the opt-out,
    with the message the loop always gave (tools/test.py checks it)."""
    for environ in ({}, {ALLOW_ENV: '1'}):
        with pytest.raises(RuntimeError) as err:
            check_single_process(2, environ)
        assert str(err.value) == DISTRIBUTED_ERROR.format(n=2)


def test_opt_out_for_a_lone_process_that_inherited_the_variables():
    environ = dict(MANY['srun -n 2 inside sbatch -n 8 (srun rewrites '
                        'SLURM_NTASKS)'][0])
    check_single_process(1, dict(environ, **{ALLOW_ENV: '1'}))
    with pytest.raises(RuntimeError):  # only '1' opts out
        check_single_process(1, dict(environ, **{ALLOW_ENV: 'yes'}))


def clear_launchers(monkeypatch):
    for name in LAUNCHER_VARIABLES + (ALLOW_ENV,):
        monkeypatch.delenv(name, raising=False)


def test_the_process_environment_is_read_by_default(monkeypatch):
    clear_launchers(monkeypatch)
    check_single_process(1)
    monkeypatch.setenv('OMPI_COMM_WORLD_SIZE', '3')
    with pytest.raises(RuntimeError, match='OMPI_COMM_WORLD_SIZE=3'):
        check_single_process(1)


def test_the_loop_refuses_before_it_builds_anything(monkeypatch):
    """``OnlineAdaptationLoop`` under ``srun -n 2 ... --launcher none``
    (MMEngine's world size 1): refused first, so no runner, model or data
    is needed to see it (before the fix it went on to build the method)."""
    from mmseg_stag.engine.online_loop import OnlineAdaptationLoop
    clear_launchers(monkeypatch)
    monkeypatch.setenv('SLURM_STEP_NUM_TASKS', '2')
    monkeypatch.setenv('SLURM_NTASKS', '2')
    with pytest.raises(RuntimeError, match='SLURM_STEP_NUM_TASKS=2'):
        OnlineAdaptationLoop(runner=None, dataloader=None, evaluator=None,
                             method=dict(type='tent'))


def test_the_run_is_checked_by_the_same_guard_before_the_runner(
        monkeypatch, tmp_path):
    """``prepare_config`` (``tools/test.py`` before it builds the runner)
    asks the same guard and raises; only ``tools/`` turns an error into an
    exit. A distributed launch makes every rank report."""
    import glob
    import os.path as osp

    from mmengine.config import Config

    from mmseg_stag.engine.launch_guard import LaunchError
    from mmseg_stag.engine.runs import prepare_config
    cfg = Config(dict(test_cfg=dict(type='OnlineAdaptationLoop')))
    clear_launchers(monkeypatch)
    with pytest.raises(LaunchError, match='across several ranks') as err:
        prepare_config(cfg.copy(), str(tmp_path), launcher='pytorch')
    assert not err.value.every_rank_reports
    monkeypatch.setenv('WORLD_SIZE', '2')
    with pytest.raises(LaunchError, match='across 2 ranks') as err:
        prepare_config(cfg.copy(), str(tmp_path))
    assert err.value.every_rank_reports
    clear_launchers(monkeypatch)
    monkeypatch.setenv('SLURM_STEP_NUM_TASKS', '2')
    with pytest.raises(LaunchError, match='SLURM_STEP_NUM_TASKS=2'):
        prepare_config(cfg.copy(), str(tmp_path))
    clear_launchers(monkeypatch)
    with pytest.raises(ValueError, match='--resume: no previous run in'):
        prepare_config(cfg.copy(), str(tmp_path / 'new'), resume=True)
    # MMEngine's plain test loop is not a stream: no guard
    prepare_config(Config(dict(test_cfg=dict())), str(tmp_path),
                   launcher='pytorch')
    package = osp.join(osp.dirname(osp.dirname(osp.dirname(
        osp.abspath(__file__)))), 'mmseg_stag')
    for path in glob.glob(osp.join(package, '**', '*.py'), recursive=True):
        with open(path, encoding='utf-8') as f:
            assert 'SystemExit' not in f.read(), path
