"""``tools/install_env.sh`` on a GPU machine, before the long MMCV build,
and ``make install``'s re-check of a changed torch.

MMCV 2.1.0's setup.py compiles CUDA ops whenever torch sees a GPU, so the
build needs an nvcc whose major version is torch's CUDA.
``tools/check_cuda_build.py`` checks that first; here with fake ``nvcc``
scripts and ``--gpu``/``--torch-cuda`` in place of a GPU, and the install
script itself with a stand-in ``python`` that records each pip call and
the environment it got (no package is installed)."""
import importlib.util
import os
import os.path as osp
import stat
import subprocess
import sys

import pytest

REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
CHECK = osp.join(REPO, 'tools', 'check_cuda_build.py')
INSTALL = osp.join(REPO, 'tools', 'install_env.sh')
#: the system's own tools, without /usr/local/bin (where a CUDA may live)
SYSTEM_PATH = '/usr/bin:/bin'


def load_check():
    spec = importlib.util.spec_from_file_location('check_cuda_build', CHECK)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def executable(path, text):
    os.makedirs(osp.dirname(path), exist_ok=True)
    with open(path, 'w') as f:
        f.write(text)
    os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR)
    return str(path)


def fake_cuda(root, release):
    """A CUDA_HOME whose ``bin/nvcc --version`` says ``release``."""
    executable(osp.join(root, 'bin', 'nvcc'), (
        '#!/bin/sh\necho "nvcc: NVIDIA (R) Cuda compiler driver"\n'
        f'echo "Cuda compilation tools, release {release}, V{release}.1"\n'))
    return str(root)


def check(*args, **env):
    return subprocess.run([sys.executable, CHECK, *args], capture_output=True,
                          text=True, env={'PATH': SYSTEM_PATH, **env})


def test_no_gpu_builds_the_cpu_ops(tmp_path):
    done = check('--no-gpu', '--torch-cuda', '12.1',
                 CUDA_HOME=fake_cuda(tmp_path, '11.8'))
    assert done.returncode == 0 and done.stdout == 'cpu\n', done.stderr
    assert load_check().plan(False, None, {})[0] == 'cpu'


def test_matching_nvcc_on_path_builds_the_cuda_ops(tmp_path):
    cuda = fake_cuda(tmp_path, '12.1')
    done = check('--gpu', '--torch-cuda', '12.1',
                 PATH=osp.join(cuda, 'bin') + ':' + SYSTEM_PATH)
    assert done.returncode == 0 and done.stdout == 'cuda\n', done.stderr
    assert osp.join(cuda, 'bin', 'nvcc') in done.stderr


def test_a_minor_difference_builds_as_torch_does(tmp_path):
    done = check('--gpu', '--torch-cuda', '12.4',
                 CUDA_HOME=fake_cuda(tmp_path, '12.1'))
    assert done.returncode == 0 and done.stdout == 'cuda\n', done.stderr
    assert 'torch: CUDA 12.4, a minor difference' in done.stderr


def test_cuda_home_comes_before_path(tmp_path):
    home = fake_cuda(tmp_path / 'home', '12.1')
    other = fake_cuda(tmp_path / 'other', '11.8')
    done = check('--gpu', '--torch-cuda', '12.1', CUDA_HOME=home,
                 PATH=osp.join(other, 'bin') + ':' + SYSTEM_PATH)
    assert done.stdout == 'cuda\n', done.stderr
    assert osp.join(home, 'bin', 'nvcc') in done.stderr


def refusal_says_what_to_do(stderr):
    assert stderr.count('error') == 1, stderr  # one message
    assert 'torch sees a GPU' in stderr
    assert 'FORCE_CUDA=0 does not stop it' in stderr
    assert 'CUDA_HOME' in stderr and 'toolkit' in stderr
    assert 'MMCV_OPS=cpu make install' in stderr  # the way out
    assert 'SegFormer' in stderr


def test_another_major_version_is_refused_saying_what_differs(tmp_path):
    done = check('--gpu', '--torch-cuda', '12.1',
                 CUDA_HOME=fake_cuda(tmp_path, '13.0'))
    assert done.returncode == 1 and done.stdout == ''
    assert 'is CUDA 13.0, torch was built with CUDA 12.1 (the major ' \
        'versions differ)' in done.stderr
    assert 'install the CUDA 12.1 toolkit' in done.stderr
    refusal_says_what_to_do(done.stderr)


def test_no_nvcc_is_refused(tmp_path):
    done = check('--gpu', '--torch-cuda', '12.1', CUDA_HOME=str(tmp_path))
    assert done.returncode == 1
    assert f'no nvcc found (looked in CUDA_HOME={tmp_path})' in done.stderr
    refusal_says_what_to_do(done.stderr)
    # nothing set, nothing on PATH, no toolkit at torch's last guess
    module = load_check()
    nvcc, where = module.find_nvcc(dict(PATH=str(tmp_path)),
                                   default_home=str(tmp_path / 'cuda'))
    assert nvcc is None and 'CUDA_HOME (unset), PATH and' in where


def test_force_cuda_without_a_gpu_is_checked_too(tmp_path):
    done = check('--no-gpu', '--torch-cuda', '12.1', FORCE_CUDA='1',
                 CUDA_HOME=fake_cuda(tmp_path, '11.8'))
    assert done.returncode == 1
    assert 'FORCE_CUDA=1: MMCV 2.1.0 compiles its CUDA ops' in done.stderr
    done = check('--no-gpu', '--torch-cuda', 'none', FORCE_CUDA='1')
    assert done.returncode == 1 and 'this torch is a CPU build' in \
        done.stderr


def test_a_rocm_torch_is_left_to_mmcv():
    assert load_check().plan(True, None, {}, is_rocm=True)[0] == 'rocm'


# -- the install script, with a stand-in python ---------------------------
STUB_PYTHON = r'''#!/usr/bin/env bash
# version_ok: every package is kept but mmcv, which is then built
case "$1" in
  -) [ "$2" = mmcv ] && exit 1; exit 0 ;;
  -m) echo "$* | CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES-unset}" \
        "FORCE_CUDA=${FORCE_CUDA-unset}" \
        "MMCV_WITH_OPS=${MMCV_WITH_OPS-unset}" \
        "CFLAGS=${CFLAGS-unset}" >> "$STUB_LOG"; exit 0 ;;
  -c) case "$2" in *sysconfig*) echo '-DNDEBUG -O3'; exit 0 ;; esac
      [ "$2" = 'import mmcv' ] && exit "${STUB_MMCV_IMPORTS:-1}"
      [ -n "${STUB_PRINTS:-}" ] && echo "$STUB_PRINTS"; exit 0 ;;
  *check_cuda_build.py) exec "$REAL_PYTHON" "$@" $STUB_TORCH ;;
esac
'''


def install(tmp_path, torch, **env):
    """Run install_env.sh into a stand-in venv: ``(done, pip calls)``."""
    venv = tmp_path / 'venv'
    executable(venv / 'bin' / 'python', STUB_PYTHON)
    log = tmp_path / 'pip.log'
    log.write_text('')
    done = subprocess.run(
        ['bash', INSTALL, str(venv), 'python3'], capture_output=True,
        text=True, timeout=120, env=dict(
            PATH=SYSTEM_PATH, HOME=str(tmp_path), STUB_LOG=str(log),
            REAL_PYTHON=sys.executable, STUB_TORCH=torch, **env))
    return done, log.read_text().splitlines()


def mmcv_builds(calls):
    return [c for c in calls if 'mmcv==2.1.0' in c]


def test_install_stops_before_the_mmcv_build_on_a_mismatch(tmp_path):
    done, calls = install(tmp_path, '--gpu --torch-cuda 12.1',
                          CUDA_HOME=fake_cuda(tmp_path / 'cuda', '13.0'))
    assert done.returncode != 0, done.stdout
    refusal_says_what_to_do(done.stderr)
    assert not mmcv_builds(calls), calls  # no 15-minute build that fails
    assert not [c for c in calls if 'mmsegmentation' in c]


def test_install_cpu_route_hides_the_gpu_from_the_mmcv_build(tmp_path):
    done, calls = install(tmp_path, '--gpu --torch-cuda 12.1',
                          MMCV_OPS='cpu',
                          CUDA_HOME=fake_cuda(tmp_path / 'cuda', '13.0'))
    assert done.returncode == 0, done.stderr
    [build] = mmcv_builds(calls)
    assert 'CUDA_VISIBLE_DEVICES= FORCE_CUDA=0 MMCV_WITH_OPS=1' in build
    # the GPU is hidden from that build only
    assert all('CUDA_VISIBLE_DEVICES=unset' in c for c in calls
               if c is not build)


def test_install_with_a_matching_nvcc_builds_the_cuda_ops(tmp_path):
    done, calls = install(tmp_path, '--gpu --torch-cuda 12.1',
                          CUDA_HOME=fake_cuda(tmp_path / 'cuda', '12.1'),
                          STUB_PRINTS='not available')
    assert done.returncode == 0, done.stderr
    assert 'mmcv 2.1.0 with cuda ops' in done.stdout
    [build] = mmcv_builds(calls)
    assert 'CUDA_VISIBLE_DEVICES=unset' in build
    # a cached CPU-ops wheel reused by pip is said, with the fix
    assert 'pip reused a cached mmcv wheel with CPU ops only' in done.stderr


def test_install_without_a_gpu_builds_the_cpu_ops_as_before(tmp_path):
    done, calls = install(tmp_path, '--no-gpu --torch-cuda none')
    assert done.returncode == 0, done.stderr
    assert 'mmcv 2.1.0 with CPU ops' in done.stdout
    [build] = mmcv_builds(calls)
    assert 'CUDA_VISIBLE_DEVICES=unset FORCE_CUDA=0 MMCV_WITH_OPS=1' in build
    # no debug information in the ops (a third of the build), the build
    # only, after Python's own flags (which a CFLAGS would replace) or a
    # user's own CFLAGS
    assert build.endswith('CFLAGS=-DNDEBUG -O3 -g0')
    assert all('CFLAGS=unset' in c for c in calls if c is not build)
    _, calls = install(tmp_path / 'own', '--no-gpu --torch-cuda none',
                       CFLAGS='-march=native')
    assert mmcv_builds(calls)[0].endswith('CFLAGS=-march=native -g0')


def test_install_rebuilds_an_mmcv_whose_ops_fail_without_the_cache(
        tmp_path):
    """MMCV imports but its compiled ops do not (built for another torch):
    rebuilt, not handed back from pip's cache."""
    done, calls = install(tmp_path, '--no-gpu --torch-cuda none',
                          STUB_MMCV_IMPORTS='0')
    assert done.returncode == 0, done.stderr
    assert 'its ops do not load' in done.stdout
    [build] = mmcv_builds(calls)
    assert '--no-cache-dir --force-reinstall --no-deps' in build
    _, calls = install(tmp_path / 'fresh', '--no-gpu --torch-cuda none')
    assert '--no-cache-dir' not in mmcv_builds(calls)[0]


# -- with faked package versions in a real interpreter --------------------
def fake_venv(tmp_path, torch_version=None, broken_mmcv=False):
    """A virtualenv folder whose ``bin/python`` is this interpreter, with a
    stand-in ``torch`` of ``torch_version`` and an MMCV whose ops do not
    import shadowing the real ones when asked."""
    venv = tmp_path / 'venv'
    fakes = tmp_path / 'fakes'
    (venv / 'bin').mkdir(parents=True)
    fakes.mkdir()
    if torch_version:
        (fakes / 'torch').mkdir()
        (fakes / 'torch' / '__init__.py').write_text(
            f'__version__ = {torch_version!r}\n')
    if broken_mmcv:
        (fakes / 'mmcv' / 'ops').mkdir(parents=True)
        (fakes / 'mmcv' / '__init__.py').write_text("__version__ = '2.1.0'\n")
        for module in ('ops/__init__.py', '_ext.py'):
            (fakes / 'mmcv' / module).write_text(
                "raise ImportError('undefined symbol: _ZN3c10...')\n")
    executable(venv / 'bin' / 'python', (
        f'#!/bin/sh\nPYTHONPATH={fakes}${{PYTHONPATH:+:$PYTHONPATH}} '
        f'exec {sys.executable} "$@"\n'))
    return venv


def make_install(venv, stamp):
    """``make -n install`` for ``venv`` (what make would run), the stamp
    written first unless None."""
    if stamp is not None:
        (venv / '.mmseg_stag_installed').write_text(stamp + '\n')
    proc = subprocess.run(['make', '-n', 'install', f'VENV={venv}'],
                          cwd=REPO, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_make_install_again_when_torch_or_mmcv_changed(tmp_path):
    import torch
    venv = fake_venv(tmp_path)
    current = torch.__version__
    assert 'install_env.sh' not in make_install(venv, current)
    # torch changed since the install, an old empty stamp, no stamp
    for stamp in ('2.11.0', ''):
        assert 'bash tools/install_env.sh' in make_install(venv, stamp)
    os.remove(venv / '.mmseg_stag_installed')
    assert 'bash tools/install_env.sh' in make_install(venv, None)
    # the same torch, but MMCV's compiled ops fail to load
    broken = fake_venv(tmp_path / 'b', broken_mmcv=True)
    assert 'bash tools/install_env.sh' in make_install(broken, current)


@pytest.mark.parametrize('version', ['2.14.1', '2.15.0+cu130'])
def test_install_stops_before_building_mmcv_for_torch_2_14(tmp_path,
                                                           version):
    venv = fake_venv(tmp_path, torch_version=version, broken_mmcv=True)
    done = subprocess.run(['bash', INSTALL, str(venv)], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, done.stdout + done.stderr
    assert f'torch {version} is in {venv}' in done.stderr
    assert 'C++20' in done.stderr and 'torch==2.13.0' in done.stderr
    assert 'mmcv 2.1.0 with' not in done.stdout  # no build started


# -- the pinned versions (constraints.txt) ---------------------------------
CONSTRAINTS = osp.join(REPO, 'constraints.txt')


def pins():
    with open(CONSTRAINTS) as f:
        lines = [ln.strip() for ln in f if ln.strip() and
                 not ln.startswith('#')]
    return dict(ln.split('==') for ln in lines)


def test_every_pip_call_of_the_install_is_pinned(tmp_path):
    done, calls = install(tmp_path, '--no-gpu --torch-cuda none')
    assert done.returncode == 0, done.stderr
    pip_calls = [c for c in calls if ' pip install ' in c]
    assert pip_calls and all(f'-c {CONSTRAINTS} ' in c for c in pip_calls)
    # without pins on request, said; a wrong path stops before any pip call
    done, calls = install(tmp_path / 'none', '--no-gpu --torch-cuda none',
                          MMSEG_STAG_CONSTRAINTS='none')
    assert done.returncode == 0 and 'are not pinned' in done.stdout
    assert not [c for c in calls if ' -c ' in c]
    done, calls = install(tmp_path / 'bad', '--no-gpu --torch-cuda none',
                          MMSEG_STAG_CONSTRAINTS=str(tmp_path / 'nope.txt'))
    assert done.returncode == 1 and calls == []
    assert f'MMSEG_STAG_CONSTRAINTS={tmp_path}/nope.txt: no such file' in \
        done.stderr


def test_the_constraints_pin_what_the_script_installs_but_torch_and_mmcv():
    pinned = pins()
    # torch: the user's own is kept (CUDA builds); mmcv: built by the
    # script with its ops, never by a later pip call
    assert 'torch' not in pinned and 'mmcv' not in pinned
    with open(INSTALL) as f:
        script = f.read()
    for name in ('mmengine', 'mmsegmentation', 'setuptools'):
        assert f'{name}=={pinned[name]}' in script, name
    # the packages the demos' numbers move with
    for name in ('numpy', 'pillow', 'opencv-python', 'scipy', 'scikit-image',
                 'imagecorruptions-imaug', 'mlxtend'):
        assert name in pinned, name


# -- the real classifiers' environment (.venv-real) --------------------------
INSTALL_REAL = osp.join(REPO, 'tools', 'install_real_models_env.sh')
CONSTRAINTS_REAL = osp.join(REPO, 'constraints-real.txt')


def test_the_real_models_environment_is_pinned(tmp_path):
    """Every pip call of tools/install_real_models_env.sh takes
    constraints-real.txt, which pins timm, numpy and the rest (not torch
    and torchvision: the script's own pins, which bring their NVIDIA
    libraries and Triton)."""
    venv = tmp_path / 'venv'
    executable(venv / 'bin' / 'python', STUB_PYTHON)
    log = tmp_path / 'pip.log'
    log.write_text('')
    done = subprocess.run(
        ['bash', INSTALL_REAL, str(venv), 'python3'], capture_output=True,
        text=True, timeout=120, env=dict(
            PATH=SYSTEM_PATH, HOME=str(tmp_path), STUB_LOG=str(log),
            REAL_PYTHON=sys.executable, STUB_TORCH='none'))
    assert done.returncode == 0, done.stderr
    pip_calls = [c for c in log.read_text().splitlines()
                 if ' pip install ' in c]
    assert len(pip_calls) == 3
    assert all(f'-c {CONSTRAINTS_REAL} ' in c for c in pip_calls)
    with open(CONSTRAINTS_REAL) as f:
        pinned = dict(ln.strip().split('==') for ln in f
                      if ln.strip() and not ln.startswith('#'))
    for name in ('timm', 'numpy', 'safetensors', 'mmengine', 'setuptools'):
        assert name in pinned, name
    for name in ('torch', 'torchvision', 'triton'):
        assert name not in pinned, name
    assert not [n for n in pinned if n.startswith('nvidia-')]
    with open(INSTALL_REAL) as f:
        script = f.read()
    assert 'torch==2.14.1 torchvision==0.29.1' in script
    assert f"mmengine=={pinned['mmengine']}" in script
