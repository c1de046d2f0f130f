"""The reduced demos' numbers, recorded, and the drift check: exact on every
x86-64 processor.

Design: **pinned kernel paths**. A CPU's numeric kernels follow its
instruction set and microarchitecture (AVX-512 or AVX2, Intel or AMD):
oneDNN, MKL, ATen, OpenBLAS, NumPy and OpenCV each take another path and
round differently, and the demos train their models on the CPU, so the
last digits move on to counts of correct images and to a chosen β0. The
demos therefore run with every one of those paths fixed to one that every
x86-64 processor has (``demo_data/kernel_paths.py``: ATen's default
kernels, oneDNN at SSE4.1, MKL's processor-independent branch, OpenBLAS
Nehalem, NumPy's and OpenCV's baseline SIMD, one thread), and the check is
exact: the same code and pins give the same digits on any processor. An
unpinned run differs by path; how much, per recorded number, is measured
by ``tests/demo/kernel_spread.py`` over every kernel path this machine can
take and stored under ``spread`` in ``recorded_numbers.json``, with how
it was measured: it says what the pin guards against, nothing here
compares with it.

The pins of ``constraints.txt`` keep a clean install on the recorded
numbers. After a deliberate change of the numbers (a pin, a method),
record them again (any machine: the paths are pinned)::

    MMSEG_STAG_RECORD_NUMBERS=1 .venv/bin/python -m pytest tests/demo \\
        -k reduced_demo
"""
import importlib.metadata
import json
import os
import os.path as osp
import platform
import re
import sys
from typing import List, Mapping, Optional

REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
if REPO not in sys.path:  # the script kernel_spread.py imports this too
    sys.path.insert(0, REPO)
from demo_data.kernel_paths import (cpu_flags, describe,  # noqa: E402
                                    instruction_set, is_pinned, pinned_env)

PATH = osp.join(REPO, 'tests', 'demo', 'recorded_numbers.json')
CONSTRAINTS = osp.join(REPO, 'constraints.txt')
RECORD = os.environ.get('MMSEG_STAG_RECORD_NUMBERS') == '1'
#: the demos' subprocesses: the pinned kernel paths, one thread
ENV = pinned_env(os.environ)

#: the reduced demos, as the tests and kernel_spread.py run them
REDUCED = {
    # 64x32 images, 5 training iterations, 2 rounds, four methods
    # (Hybrid-TTA+STAG, make demo-hybrid's, too), one beta0 candidate
    'seg': ['tools/demo.py', '--size', '64', '32', '--train-images', '4',
            '--per-condition', '2', '--train-iters', '5', '--rounds', '2',
            '--methods', 'source', 'tent', 'tent-stag', 'hybrid-tta-stag',
            '--beta-grid', '100', '--log-interval', '4'],
    # 30 digits a corruption, the BN CNN trained 1 epoch, mild scenario
    'cls': ['tools/demo_cls.py', '--n-test', '30', '--nets', 'bn',
            '--scenarios', 'mild', '--methods', 'tent', 'eata', '--epochs',
            '1', '--beta-grid', '10', '50', '--gamma-grid', '10',
            '--workers', '1'],
}


def reduced_command(key: str, work_dir: str, python=sys.executable,
                    extra=()) -> List[str]:
    script, *args = REDUCED[key]
    return [python, osp.join(REPO, script), '--work-dir', str(work_dir)] + \
        args + list(extra)


def reduced_numbers(key: str, work_dir: str):
    """The numbers a reduced demo's outputs hold, as recorded: seg, each
    method's stage mIoU (6 decimals); cls, the clean accuracy, the β0/γ
    chosen and each row's correct images per corruption."""
    if key == 'seg':
        with open(osp.join(work_dir, 'demo_summary.json')) as f:
            summary = json.load(f)
        return {m: [round(s['score'], 6) for s in r['stages']]
                for m, r in summary['methods'].items()}
    with open(osp.join(work_dir, 'summary.json')) as f:
        summary = json.load(f)
    setting = summary['settings']['mild_bn']
    return dict(
        clean_test_acc=summary['clean_test_acc'],
        choices={m: [c['beta0'], c['gamma']]
                 for m, c in setting['choices'].items()},
        rows={r['name']: [c['correct'] for c in r['per_corruption'].values()]
              for r in setting['rows']})


def pinned_versions():
    """``{name: version}`` of ``constraints.txt``."""
    with open(CONSTRAINTS) as f:
        lines = [ln.strip() for ln in f
                 if ln.strip() and not ln.startswith('#')]
    return dict(ln.split('==') for ln in lines)


def installed_version(name):
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def cpu_model() -> str:
    # the name a run's provenance gives its CPU
    import torch

    from mmseg_stag.engine.provenance import device_name
    return device_name(torch.device('cpu'))


def environment(env: Mapping[str, str] = ENV):
    """What numbers made by a run with ``env`` are made with."""
    import torch
    return dict(python=platform.python_version(),
                torch=torch.__version__,
                machine=platform.machine(), processor=cpu_model(),
                instruction_set=instruction_set(cpu_flags()),
                kernel_paths=describe(is_pinned(env)),
                constraints='constraints.txt')


def package_differences():
    """Lines naming each package installed at another version than its
    pin."""
    return [f'  {name}: pinned {pin}, installed {installed_version(name)}'
            for name, pin in sorted(pinned_versions().items())
            if installed_version(name) != pin]


def differing(numbers, recorded, where: str = '') -> List[str]:
    """The places (``'rows.TENT[3]: 11 vs 13'``) where two JSON-like trees
    of numbers differ, in value, shape or keys; empty when equal."""
    if isinstance(recorded, dict) and isinstance(numbers, dict):
        if set(numbers) != set(recorded):
            return [f'{where or "top"}: keys {sorted(numbers)} vs '
                    f'{sorted(recorded)}']
        return [line for key in sorted(recorded) for line in differing(
            numbers[key], recorded[key],
            f'{where}.{key}' if where else str(key))]
    if isinstance(recorded, list) and isinstance(numbers, list):
        if len(numbers) != len(recorded):
            return [f'{where}: {len(numbers)} numbers vs {len(recorded)}']
        return [line for i, (a, b) in enumerate(zip(numbers, recorded))
                for line in differing(a, b, f'{where}[{i}]')]
    return [] if numbers == recorded else [f'{where}: {numbers} vs {recorded}']


def spread(trees):
    """Per number of equally shaped JSON-like trees, ``max - min`` over
    them (rounded to 6 decimals; a non-number: 0 where all agree)."""
    first = trees[0]
    if isinstance(first, dict):
        return {k: spread([t[k] for t in trees]) for k in first}
    if isinstance(first, list):
        return [spread([t[i] for t in trees]) for i in range(len(first))]
    if all(isinstance(t, (int, float)) for t in trees):
        return round(max(trees) - min(trees), 6)
    return 0 if all(t == first for t in trees) else 'differs'


def load():
    if not osp.isfile(PATH):
        return {}
    with open(PATH) as f:
        return json.load(f)


def save(data):
    text = json.dumps(data, indent=1, sort_keys=True)
    # one line per list of numbers
    text = re.sub(r'\[[^\[\]{}"]*\]',
                  lambda m: ' '.join(m.group(0).split()), text)
    with open(PATH, 'w') as f:
        f.write(text + '\n')


def record(key, numbers):
    data = load()
    data.setdefault('demos', {})[key] = numbers
    data['recorded_with'] = environment()
    save(data)


def drift_message(key, numbers, data, env: Mapping[str, str] = ENV
                  ) -> Optional[str]:
    """Why ``numbers``, made by a run with ``env``, are not the recording
    of ``key`` (None when they are), naming what is known to differ."""
    recorded = data['demos'][key]
    if numbers == recorded:
        return None
    was = data.get('recorded_with', {})
    now = environment(env)
    packages = package_differences()
    versions = [f'  {k}: recorded with {was.get(k)}, now {now[k]}'
                for k in ('python', 'torch') if was.get(k) != now[k]]
    side = {k: f'{now[k]} (recorded: {was.get(k)})'
            for k in ('kernel_paths', 'processor', 'instruction_set')}
    if packages or versions:
        why = ('what differs from the recording:\n' + '\n'.join(
            packages + versions) + '\nA clean install (make install, '
            'constraints.txt) gives the recorded numbers.')
    elif was.get('kernel_paths') != now['kernel_paths']:
        why = (f'another kernel path: {side["kernel_paths"]}; the recorded '
               'numbers hold on the pinned paths (tests/demo/recorded.ENV)')
    elif (was.get('processor'), was.get('instruction_set')) != \
            (now['processor'], now['instruction_set']):
        why = (f'another processor, on the same pinned kernel paths and '
               f'pins: {side["processor"]}, {side["instruction_set"]}. The '
               'pin is meant to give the same digits on every x86-64 '
               'processor, so a kernel path it does not fix differs here: '
               'report this message with the processor (issues), and '
               'compare with the spread of unpinned paths under "spread" '
               f'in {osp.relpath(PATH, REPO)}')
    else:
        why = ('the kernel paths, the processor and the pins are the '
               "recording's: the code changed the numbers; a deliberate "
               'change records them again (the docstring of '
               'tests/demo/recorded.py)')
    return (f'the reduced demo {key!r} drifted from its recorded numbers '
            f'({osp.relpath(PATH, REPO)}, exact on the pinned kernel '
            f'paths), now vs recorded:\n  '
            + '\n  '.join(differing(numbers, recorded)) + '\n'
            f'this run: {now["processor"]}, {now["instruction_set"]}, '
            f'kernel paths {now["kernel_paths"]}\n'
            f'recorded: {was.get("processor")}, '
            f'{was.get("instruction_set")}, kernel paths '
            f'{was.get("kernel_paths")}\n' + why)


def check_or_record(key, numbers):
    """Compare ``numbers`` (JSON-able) with the recording under ``key``, or
    record them when ``MMSEG_STAG_RECORD_NUMBERS=1``."""
    import pytest
    if RECORD:
        record(key, numbers)
        return
    data = load()
    if key not in data.get('demos', {}):
        pytest.fail(f'{PATH} has no numbers for {key!r}: record them '
                    '(MMSEG_STAG_RECORD_NUMBERS=1, tests/demo/recorded.py)')
    message = drift_message(key, numbers, data)
    if message is not None:
        pytest.fail(message)
