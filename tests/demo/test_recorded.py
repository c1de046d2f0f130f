"""The drift check of the reduced demos (``recorded.py``) and the pin it
rests on (``demo_data/kernel_paths.py``): exact on every processor, failing
on a real change of a method whatever the processor, and saying what is
known to differ; the pin fixes every kernel path a user's environment
could choose; the measured spread of unpinned paths is stored beside the
numbers."""
import copy
import os
import subprocess
import sys

import pytest
import recorded

from demo_data import kernel_paths

DATA = recorded.load()
SEG = DATA['demos']['seg']
CLS = DATA['demos']['cls']
WAS = DATA['recorded_with']


def run_on(monkeypatch, **changes):
    """This run's environment: the recording's, with ``changes``."""
    now = dict(WAS, **changes)
    monkeypatch.setattr(recorded, 'environment', lambda env=None: now)
    monkeypatch.setattr(recorded, 'package_differences', lambda: [])


PROCESSORS = [
    {},  # the recording's own
    dict(processor='Intel(R) Xeon(R) Platinum 8481C CPU @ 2.70GHz',
         instruction_set='AVX512'),
    dict(processor='AMD EPYC 7B13', instruction_set='AVX2'),
]


@pytest.mark.parametrize('machine', PROCESSORS)
def test_exact_on_every_processor(monkeypatch, machine):
    run_on(monkeypatch, **machine)
    assert recorded.drift_message('seg', copy.deepcopy(SEG), DATA) is None
    assert recorded.drift_message('cls', copy.deepcopy(CLS), DATA) is None
    # the last digit of one stage is a drift, on every processor
    seg = copy.deepcopy(SEG)
    seg['source'][3] += 1e-6
    assert 'source[3]' in recorded.drift_message('seg', seg, DATA)


@pytest.mark.parametrize('machine', PROCESSORS)
def test_a_changed_method_fails_on_every_processor(monkeypatch, machine):
    run_on(monkeypatch, **machine)
    # TENT+STAG that computes TENT's numbers (STAG's term lost)
    seg = copy.deepcopy(SEG)
    seg['tent-stag'] = list(seg['tent'])
    message = recorded.drift_message('seg', seg, DATA)
    assert message is not None and 'tent-stag[' in message
    assert 'source' not in message.split('now vs recorded:')[1].split(
        'this run:')[0]
    # a method whose counts moved
    cls = copy.deepcopy(CLS)
    cls['rows']['TENT'] = list(cls['rows']['Source'])
    assert 'rows.TENT[' in recorded.drift_message('cls', cls, DATA)
    # another beta0 chosen
    cls = copy.deepcopy(CLS)
    beta0, gamma = cls['choices']['TENT']
    other = 50.0 if beta0 != 50.0 else 10.0
    cls['choices']['TENT'] = [other, gamma]
    assert f'choices.TENT[0]: {other} vs {beta0}' in \
        recorded.drift_message('cls', cls, DATA)


def drifted(monkeypatch, **changes):
    run_on(monkeypatch, **changes)
    seg = copy.deepcopy(SEG)
    seg['tent'][0] += 0.01
    return recorded.drift_message('seg', seg, DATA)


def test_the_message_says_what_is_known(monkeypatch):
    # all as recorded: the code
    message = drifted(monkeypatch)
    assert 'the code changed the numbers' in message
    assert f'kernel paths {WAS["kernel_paths"]}' in message
    # another processor on the pinned paths: named, not blamed on the code
    message = drifted(monkeypatch, processor='AMD EPYC 7B13',
                      instruction_set='AVX2')
    assert 'another processor' in message and 'AMD EPYC 7B13' in message
    assert 'AVX2 (recorded: ' in message
    assert 'the code changed' not in message
    # another kernel path (an unpinned run)
    message = drifted(monkeypatch, kernel_paths=kernel_paths.describe(False))
    assert 'another kernel path' in message
    assert 'the code changed' not in message
    # a package off its pin comes first
    run_on(monkeypatch, processor='Some CPU')
    monkeypatch.setattr(recorded, 'package_differences',
                        lambda: ['  numpy: pinned 2.4.6, installed 2.5.0'])
    seg = copy.deepcopy(SEG)
    seg['tent'][0] += 0.01
    message = recorded.drift_message('seg', seg, DATA)
    assert 'numpy: pinned 2.4.6, installed 2.5.0' in message
    assert 'the code changed' not in message


def test_differing_reads_shapes_and_keys():
    assert recorded.differing([1.0, 2.0], [1.0, 2.0]) == []
    assert recorded.differing([1.0, 2.0], [1.0, 2.01]) == \
        ['[1]: 2.0 vs 2.01']
    assert recorded.differing([1.0], [1.0, 2.0], 'x') == \
        ['x: 1 numbers vs 2']
    assert recorded.differing({'a': [1]}, {'b': [1]}) == \
        ["top: keys ['a'] vs ['b']"]
    assert recorded.spread([{'a': [1, 2.5]}, {'a': [3, 2.0]}]) == \
        {'a': [2, 0.5]}


def test_the_vendor_pin_of_mkl_gives_the_amd_runs_digits():
    """The evidence for the pin by vendor (``kernel_paths.mkl_pin``): the
    classification spread was measured on an AMD processor under the
    earlier pin (MKL's COMPATIBLE branch on every vendor), whose pinned
    runs differ from the recording made on Intel with COMPATIBLE; that AMD
    processor's run with MKL at SSE4.2 and the other paths as pinned
    (``all-lowest``) gives the recording, every number."""
    measured = DATA['spread']['cls']
    assert 'AMD' in measured['machine']
    assert 'MKL COMPATIBLE,' in measured['kernel_paths']
    assert measured['paths']['all-lowest']['MKL_ENABLE_INSTRUCTIONS'] == \
        'SSE4_2'
    assert recorded.differing(measured['runs']['all-lowest'],
                              DATA['demos']['cls']) == []
    assert recorded.differing(measured['runs']['pinned'],
                              DATA['demos']['cls']) != []


def test_the_recording_names_its_kernel_paths():
    assert WAS['kernel_paths'] == kernel_paths.describe(True)
    assert WAS['instruction_set'] in ('AVX512', 'AVX2')
    assert recorded.ENV[kernel_paths.MARK] == 'pinned'


def test_the_spread_of_unpinned_paths_is_stored_beside_the_numbers():
    """What tests/demo/kernel_spread.py measured: for each demo, every
    path's numbers in the recording's shape, the pinned runs equal to the
    recording under every path, and the spread of the unpinned ones."""
    for key, numbers in DATA['demos'].items():
        measured = DATA['spread'][key]
        assert measured['how'] and measured['machine']
        runs = measured['runs']
        assert {'native', 'pinned'} <= set(runs)
        # a spread measured under an earlier pin (its kernel_paths) says
        # how far the paths move, not what today's pin gives
        today = measured.get('kernel_paths') == kernel_paths.describe(True)
        for name, run in runs.items():
            assert recorded.differing(run, numbers) == [] or \
                not (today and name.startswith('pinned')), name
            assert recorded.spread([run, numbers]) is not None
        unpinned = [run for name, run in runs.items()
                    if not name.startswith('pinned')]
        assert measured['spread'] == recorded.spread(unpinned)


# ------------------------------------------------- the pin itself
AMBIENT = [
    dict(ATEN_CPU_CAPABILITY='avx512', ONEDNN_MAX_CPU_ISA='AVX512_CORE',
         MKL_ENABLE_INSTRUCTIONS='AVX512', OMP_NUM_THREADS='4'),
    dict(ATEN_CPU_CAPABILITY='avx2', MKL_CBWR='AVX2',
         NPY_DISABLE_CPU_FEATURES='X86_V4', OPENBLAS_CORETYPE='Haswell'),
    dict(DNNL_MAX_CPU_ISA='AVX2', OPENCV_IPP='avx2', MKL_NUM_THREADS='8',
         NPY_ENABLE_CPU_FEATURES='X86_V3'),
]


@pytest.mark.parametrize('ambient', AMBIENT)
def test_the_pin_replaces_every_path_a_user_chose(ambient):
    env = kernel_paths.pinned_env(dict(ambient, HOME='/home/u'))
    assert env['HOME'] == '/home/u'
    mkl = kernel_paths.mkl_pin()
    for name, value in dict(kernel_paths.PINNED, **mkl).items():
        assert env[name] == value
    for name in kernel_paths.CLEARED:
        assert name in mkl or name not in env
    assert kernel_paths.is_pinned(env)


def test_mkl_is_pinned_by_the_vendor_it_sees():
    """MKL's COMPATIBLE branch on Intel, its SSE4.2 path on the others
    (an AMD processor's COMPATIBLE branch gave other digits: the module's
    docstring), and the other vendor's variable never left set."""
    assert kernel_paths.mkl_pin('GenuineIntel') == dict(
        MKL_CBWR='COMPATIBLE,STRICT')
    for vendor in ('AuthenticAMD', 'HygonGenuine', ''):
        assert kernel_paths.mkl_pin(vendor) == dict(
            MKL_ENABLE_INSTRUCTIONS='SSE4_2')
    env = kernel_paths.pinned_env(dict(MKL_CBWR='AVX2',
                                       MKL_ENABLE_INSTRUCTIONS='AVX512'))
    assert {k: env.get(k) for k in ('MKL_CBWR', 'MKL_ENABLE_INSTRUCTIONS')
            } == dict(dict(MKL_CBWR=None, MKL_ENABLE_INSTRUCTIONS=None),
                      **kernel_paths.mkl_pin())
    for other in (dict(ATEN_CPU_CAPABILITY='avx2'),
                  dict(MKL_ENABLE_INSTRUCTIONS='AVX2')):
        assert not kernel_paths.is_pinned(dict(env, **other))
    assert kernel_paths.pinned_env(env) == env


def test_opencv_is_told_only_the_features_this_processor_has():
    avx2 = frozenset('sse4_1 sse4_2 popcnt f16c avx avx2 fma'.split())
    assert kernel_paths.opencv_disable(avx2) == \
        'SSE4.1,SSE4.2,POPCNT,FP16,AVX,AVX2,FMA3'
    avx512 = avx2 | {'avx512f', 'avx512cd', 'avx512bw', 'avx512dq',
                     'avx512vl'}
    assert kernel_paths.opencv_disable(avx512).endswith(
        'FMA3,AVX512F,AVX512-SKX')
    assert kernel_paths.instruction_set(avx512) == 'AVX512'
    assert kernel_paths.instruction_set(avx2) == 'AVX2'
    assert kernel_paths.instruction_set(frozenset({'sse4_2'})) == \
        'below AVX2'


PROBE = r'''
import json, os, subprocess, sys
import numpy, torch, cv2
from numpy._core._multiarray_umath import __cpu_features__ as npy
a = torch.rand(64, 64)
(a @ a).sum()
torch.nn.Conv2d(16, 16, 3)(torch.rand(2, 16, 32, 32)).sum().backward()
b = numpy.ones((64, 64))
b @ b
print(json.dumps(dict(
    aten=torch.backends.cpu.get_cpu_capability(),
    threads=torch.get_num_threads(),
    numpy_above_baseline=sorted(k for k in ('X86_V3', 'X86_V4', 'AVX512_ICL',
                                            'AVX512_SPR') if npy.get(k)),
    opencv_avx2=cv2.checkHardwareSupport(11),
    opencv_sse41=cv2.checkHardwareSupport(6),
    opencv_ipp=cv2.ipp.getIppVersion(), opencv_threads=cv2.getNumThreads())))
'''


@pytest.mark.parametrize('ambient', AMBIENT[:2])
def test_the_pinned_process_takes_the_pinned_paths(ambient):
    """In a process started with the pin, whatever the ambient variables
    said: each library reports the pinned path (oneDNN, MKL and OpenBLAS
    through their verbose logs)."""
    env = kernel_paths.pinned_env(dict(os.environ, **ambient))
    env.update(ONEDNN_VERBOSE='1', MKL_VERBOSE='1', OPENBLAS_VERBOSE='2')
    proc = subprocess.run([sys.executable, '-c', PROBE], env=env,
                          capture_output=True, text=True, check=True)
    import json
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report['aten'] == 'DEFAULT' and report['threads'] == 1
    assert report['numpy_above_baseline'] == []
    assert not report['opencv_avx2'] and not report['opencv_sse41']
    assert 'SSE4.2' in report['opencv_ipp']
    assert report['opencv_threads'] == 1
    logs = proc.stdout + proc.stderr
    assert 'isa:Intel SSE4.1' in logs  # oneDNN
    # MKL: its branch by vendor (mkl_pin), one thread
    if 'MKL_CBWR' in kernel_paths.mkl_pin():
        assert 'CNR:COMPATIBLE,STRICT' in logs
    else:  # capped at SSE4.2 (the pinned variable), no CNR branch
        assert 'CNR:OFF' in logs
    assert 'NThr:1' in logs
    assert 'Core: Nehalem' in logs  # OpenBLAS
    assert 'OPENCV: Trying to disable' not in logs


def test_a_command_of_ones_own_on_the_pinned_paths():
    """``python demo_data/kernel_paths.py COMMAND``: a demo row's config run
    by hand on the demos' paths."""
    script = os.path.join(recorded.REPO, 'demo_data', 'kernel_paths.py')
    proc = subprocess.run(
        [sys.executable, script, sys.executable, '-c',
         'import os; print(os.environ["ATEN_CPU_CAPABILITY"], '
         'os.environ["MMSEG_STAG_KERNEL_PATHS"])'],
        env=dict(os.environ, ATEN_CPU_CAPABILITY='avx2'),
        capture_output=True, text=True, check=True)
    assert proc.stdout.split() == ['default', 'pinned']
    proc = subprocess.run([sys.executable, script], capture_output=True,
                          text=True)
    assert proc.returncode == 1 and 'usage' in proc.stderr
