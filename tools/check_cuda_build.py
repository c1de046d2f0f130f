"""How MMCV 2.1.0's ops will build here, checked before the long build.

    python tools/check_cuda_build.py [--gpu | --no-gpu] [--torch-cuda X.Y|none]

Follows MMCV's ``setup.py`` (CUDA ops whenever torch sees a GPU or
``FORCE_CUDA=1``; ``FORCE_CUDA=0`` does not stop it) and torch's extension
builder (``nvcc`` from ``CUDA_HOME``, ``CUDA_PATH``, ``PATH``, then
``/usr/local/cuda``; its major version must be ``torch.version.cuda``'s)
and prints one word for ``tools/install_env.sh``: ``cpu``, ``cuda`` or
``rocm`` (HIP ops, not checked). A CUDA build that cannot work exits 1 with
one message: what to install, and the CPU route (docs/get-started.md).
``--gpu``/``--no-gpu`` and ``--torch-cuda`` replace what torch reports
(the tests use them; with both given, torch is not imported).
"""
import argparse
import os
import os.path as osp
import re
import shutil
import subprocess
import sys

#: torch's last guess for the CUDA toolkit (torch.utils.cpp_extension)
DEFAULT_CUDA_HOME = '/usr/local/cuda'
#: the install route that needs no CUDA toolkit (tools/install_env.sh)
CPU_ROUTE = 'MMCV_OPS=cpu make install'


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description='check that MMCV can build its ops here (CPU, or CUDA '
        'with an nvcc matching torch)')
    gpu = parser.add_mutually_exclusive_group()
    gpu.add_argument('--gpu', dest='gpu', action='store_true', default=None,
                     help='as if torch saw a GPU (default: ask torch)')
    gpu.add_argument('--no-gpu', dest='gpu', action='store_false',
                     help='as if torch saw no GPU')
    parser.add_argument('--torch-cuda', metavar='X.Y|none',
                        help="torch's CUDA version (default: "
                        'torch.version.cuda)')
    return parser.parse_args(argv)


def torch_facts(gpu=None, torch_cuda=None):
    """``(gpu, torch_cuda, is_rocm)``: what torch reports, unless given."""
    is_rocm = False
    if gpu is None or torch_cuda is None:
        import torch
        gpu = torch.cuda.is_available() if gpu is None else gpu
        if torch_cuda is None:
            torch_cuda = torch.version.cuda
        is_rocm = getattr(torch.version, 'hip', None) is not None
    if torch_cuda is not None and torch_cuda.lower() == 'none':
        torch_cuda = None
    return gpu, torch_cuda, is_rocm


def find_nvcc(environ, default_home=DEFAULT_CUDA_HOME):
    """``(nvcc path or None, where it was looked for)``, torch's order."""
    home = environ.get('CUDA_HOME') or environ.get('CUDA_PATH')
    if home:
        nvcc = osp.join(home, 'bin', 'nvcc')
        return (nvcc if osp.isfile(nvcc) else None), f'CUDA_HOME={home}'
    on_path = shutil.which('nvcc', path=environ.get('PATH', ''))
    if on_path:
        return on_path, 'PATH'
    nvcc = osp.join(default_home, 'bin', 'nvcc')
    return (nvcc if osp.isfile(nvcc) else None), \
        f'CUDA_HOME (unset), PATH and {default_home}'


def nvcc_version(nvcc):
    """``'X.Y'`` from ``nvcc --version`` (``release X.Y``), or None."""
    try:
        out = subprocess.run([nvcc, '--version'], capture_output=True,
                             text=True, timeout=60).stdout
    except OSError:
        return None
    match = re.search(r'release (\d+)\.(\d+)', out)
    return f'{match.group(1)}.{match.group(2)}' if match else None


def cuda_problem(torch_cuda, nvcc, where, found):
    """Why a CUDA build of MMCV would fail with this nvcc (None if not)."""
    if nvcc is None:
        return f'no nvcc found (looked in {where})'
    if found is None:
        return f'{nvcc} --version does not say its CUDA release'
    if found.split('.')[0] != torch_cuda.split('.')[0]:
        return (f'{nvcc} is CUDA {found}, torch was built with CUDA '
                f'{torch_cuda} (the major versions differ)')
    return None


def refusal(problem, torch_cuda, gpu=True):
    """The one message: what differs, what to install, the CPU route."""
    major_minor = '.'.join(torch_cuda.split('.')[:2])
    why = ('torch sees a GPU, so MMCV 2.1.0 compiles its CUDA ops '
           '(FORCE_CUDA=0 does not stop it)' if gpu else
           'FORCE_CUDA=1: MMCV 2.1.0 compiles its CUDA ops')
    return (
        f'[install] error: {why}, with nvcc of a CUDA {major_minor} '
        f'toolkit to match torch: {problem}. Either install '
        f'the CUDA {major_minor} toolkit (its major version must be '
        f"torch's) and point CUDA_HOME at it (e.g. export "
        f'CUDA_HOME=/usr/local/cuda-{major_minor}), then run make install '
        f'again; or build MMCV\'s CPU ops with the GPU hidden from that '
        f'build only: {CPU_ROUTE} (enough for SegFormer, whose MiT backbone '
        f'and head use no MMCV op; the runs still use the GPU).')


def plan(gpu, torch_cuda, environ, is_rocm=False,
         default_home=DEFAULT_CUDA_HOME):
    """How MMCV's ops will build: ``'cpu'``, ``'cuda'`` or ``'rocm'``, and
    a note. ``gpu``: whether torch sees one; ``torch_cuda``:
    ``torch.version.cuda``; ``environ``: ``CUDA_HOME``, ``PATH``,
    ``FORCE_CUDA``.

    Raises:
        SystemExit: If MMCV would compile CUDA ops that cannot build here.
    """
    force = environ.get('FORCE_CUDA', '0') == '1'
    if not gpu and not force:
        return 'cpu', 'torch sees no GPU: MMCV builds its CPU ops'
    if is_rocm:
        return 'rocm', 'a ROCm torch: MMCV builds its HIP ops (not checked)'
    if torch_cuda is None:
        raise SystemExit('[install] error: FORCE_CUDA=1 builds MMCV\'s CUDA '
                         'ops, but this torch is a CPU build '
                         '(torch.version.cuda is None): install a CUDA '
                         'torch first, or unset FORCE_CUDA')
    nvcc, where = find_nvcc(environ, default_home)
    found = nvcc_version(nvcc) if nvcc else None
    problem = cuda_problem(torch_cuda, nvcc, where, found)
    if problem:
        raise SystemExit(refusal(problem, torch_cuda, gpu))
    note = f'MMCV builds its CUDA ops with {nvcc} (CUDA {found}'
    if found != '.'.join(torch_cuda.split('.')[:2]):
        # torch's builder only warns when the minor versions differ
        note += f'; torch: CUDA {torch_cuda}, a minor difference'
    return 'cuda', note + ')'


def main(argv=None):
    args = parse_args(argv)
    gpu, torch_cuda, is_rocm = torch_facts(args.gpu, args.torch_cuda)
    mode, note = plan(gpu, torch_cuda, os.environ, is_rocm)
    print(f'[install] {note}', file=sys.stderr)
    print(mode)


if __name__ == '__main__':
    main()
