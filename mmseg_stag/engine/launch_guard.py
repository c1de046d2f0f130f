"""Refuse a continual stream started as several processes, by any launcher
(MMEngine's world size, else the launchers' variables: docs/sweeps.md)."""
import os
from typing import List, Mapping, Optional, Tuple, Union

#: set to 1 to skip the launchers' variables (not MMEngine's world size)
ALLOW_ENV = 'MMSEG_STAG_ALLOW_MANY_PROCESSES'
#: variables that count the processes of this job, with who sets them
SIZE_VARIABLES = {
    'WORLD_SIZE': 'torchrun',
    'SLURM_STEP_NUM_TASKS': 'srun',
    'OMPI_COMM_WORLD_SIZE': 'Open MPI',
    'PMI_SIZE': 'MPICH/Intel MPI',
    'PMIX_SIZE': 'PMIx',
    'MV2_COMM_WORLD_SIZE': 'MVAPICH2',
    'MPI_LOCALNRANKS': 'MPICH/Intel MPI, this node',
}
#: variables whose value > 0 says an earlier process of the job exists
RANK_VARIABLES = {
    'RANK': 'torchrun',
    'LOCAL_RANK': 'torchrun',
    'SLURM_PROCID': 'srun',
    'OMPI_COMM_WORLD_RANK': 'Open MPI',
    'PMI_RANK': 'MPICH/Intel MPI',
    'MPI_LOCALRANKID': 'MPICH/Intel MPI, this node',
    'PMIX_RANK': 'PMIx',
    'MV2_COMM_WORLD_RANK': 'MVAPICH2',
}
#: every variable the guard reads (tools/sweep.py drops them for its runs)
LAUNCHER_VARIABLES = tuple(SIZE_VARIABLES) + tuple(RANK_VARIABLES)

_PARALLEL_HINT = (
    'to use several GPUs or nodes, run whole streams in parallel (configs '
    'x checkpoints x seeds x beta0/gamma) with tools/sweep.py, one GPU per '
    'run, on Ray (see docs/sweeps.md, "Many runs on many GPUs").')
#: MMEngine's world size > 1 (the unit of parallel work is a run)
DISTRIBUTED_ERROR = (
    'OnlineAdaptationLoop: a continual stream is sequential (every image is '
    'predicted by the model adapted on all images before it), so it cannot '
    'be split across {n} ranks: each rank would adapt on only 1 of every {n} '
    'images and the metric would see a different stream. Run one stream '
    'with --launcher none; ' + _PARALLEL_HINT)
#: a launcher started several copies that MMEngine does not know of
MANY_PROCESSES_ERROR = (
    'OnlineAdaptationLoop: this command was started as {n} processes '
    '({evidence}), but each runs alone (MMEngine\'s world size is 1, '
    '--launcher none), so every one would run the whole continual stream '
    'and all would write the same work dir. Start it as one process '
    '(srun -n 1, torchrun --nproc-per-node 1, mpirun -n 1, or plain '
    'python); ' + _PARALLEL_HINT + ' If this process is alone and only '
    'inherited the variable, set ' + ALLOW_ENV + '=1.')


def _integer(environ: Mapping[str, str], name: str) -> Optional[int]:
    """The integer value of ``environ[name]``, or None."""
    try:
        return int(environ.get(name, ''))
    except ValueError:
        return None


def launcher_evidence(
        environ: Mapping[str, str]) -> Tuple[List[str], Union[int, str]]:
    """Return ``NAME=value (who)`` for each launcher variable of
    ``environ`` that shows another process of this job, and the largest
    process count shown (``'several'`` when only a rank > 0 shows them; 1
    if none does)."""
    found, sizes = [], []
    for name, who in SIZE_VARIABLES.items():
        value = _integer(environ, name)
        if value is not None and value > 1:
            found.append(f'{name}={value} ({who})')
            sizes.append(value)
    for name, who in RANK_VARIABLES.items():
        value = _integer(environ, name)
        if value is not None and value > 0:
            found.append(f'{name}={value} ({who})')
    n = max(sizes) if sizes else ('several' if found else 1)
    return found, n


class LaunchError(RuntimeError):
    """A continual stream started as several processes;
    ``every_rank_reports``: ranks that MMEngine's launcher counts were
    started, so each should say so before the launcher stops the others."""

    def __init__(self, message: str, every_rank_reports: bool = False):
        super().__init__(message)
        self.every_rank_reports = every_rank_reports


def check_single_process(world_size: int,
                         environ: Optional[Mapping[str, str]] = None,
                         launcher: str = 'none'):
    """Raise ``LaunchError`` unless this stream runs as a single process:
    ``world_size`` (MMEngine's, or ``WORLD_SIZE`` before MMEngine runs) is
    1, ``launcher`` is ``'none'`` and (unless :data:`ALLOW_ENV` is ``1``)
    no launcher variable of ``environ`` (default: ``os.environ``) shows
    another process of this job."""
    if world_size > 1 or launcher != 'none':
        n = world_size if world_size > 1 else 'several'
        raise LaunchError(DISTRIBUTED_ERROR.format(n=n),
                          every_rank_reports=world_size > 1)
    environ = os.environ if environ is None else environ
    if environ.get(ALLOW_ENV, '') == '1':
        return
    found, n = launcher_evidence(environ)
    if found:
        raise LaunchError(MANY_PROCESSES_ERROR.format(
            evidence=', '.join(found), n=n))
