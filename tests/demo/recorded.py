"""The reduced demos' numbers, recorded: a clean install whose numbers
drift from them fails, naming the packages that differ from
``constraints.txt``.

The demos train their source models, so a package that moves (numpy,
Pillow, OpenCV, SciPy, scikit-image, torch) moves every number after it;
the pins of ``constraints.txt`` keep a clean install on the recorded ones.
The demos run with one torch thread (``ENV``), so the core count of the
machine does not change a reduction's order. After a deliberate change of
the numbers (a pin, a method), record them again::

    MMSEG_STAG_RECORD_NUMBERS=1 .venv/bin/python -m pytest tests/demo \
        -k reduced_demo
"""
import importlib.metadata
import json
import os
import os.path as osp
import platform
import re

import pytest

REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
PATH = osp.join(REPO, 'tests', 'demo', 'recorded_numbers.json')
CONSTRAINTS = osp.join(REPO, 'constraints.txt')
RECORD = os.environ.get('MMSEG_STAG_RECORD_NUMBERS') == '1'
#: the demos' subprocesses: one intra-op thread whatever the machine
ENV = dict(os.environ, OMP_NUM_THREADS='1', MKL_NUM_THREADS='1')


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


def environment():
    """What the numbers were recorded with."""
    import torch
    return dict(python=platform.python_version(), torch=torch.__version__,
                machine=platform.machine(), processor=cpu_model(),
                constraints='constraints.txt')


def cpu_model():
    try:
        with open('/proc/cpuinfo') as f:
            for line in f:
                if line.startswith('model name'):
                    return line.split(':', 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or 'unknown'


def differences(recorded_env):
    """Lines naming what differs from the recording's environment."""
    lines = [f'  {name}: pinned {pin}, installed {installed_version(name)}'
             for name, pin in sorted(pinned_versions().items())
             if installed_version(name) != pin]
    now = environment()
    lines += [f'  {key}: recorded with {recorded_env.get(key)}, now '
              f'{now[key]}' for key in ('python', 'torch', 'processor')
              if recorded_env.get(key) != now[key]]
    return lines


def load():
    if not osp.isfile(PATH):
        return {}
    with open(PATH) as f:
        return json.load(f)


def check_or_record(key, numbers):
    """Compare ``numbers`` (JSON-able) with the recording under ``key``, or
    record them when ``MMSEG_STAG_RECORD_NUMBERS=1``."""
    data = load()
    if RECORD:
        data.setdefault('demos', {})[key] = numbers
        data['recorded_with'] = environment()
        text = json.dumps(data, indent=1, sort_keys=True)
        # one line per list of numbers
        text = re.sub(r'\[[^\[\]{}"]*\]',
                      lambda m: ' '.join(m.group(0).split()), text)
        with open(PATH, 'w') as f:
            f.write(text + '\n')
        return
    if key not in data.get('demos', {}):
        pytest.fail(f'{PATH} has no numbers for {key!r}: record them '
                    '(MMSEG_STAG_RECORD_NUMBERS=1, tests/demo/recorded.py)')
    recorded = data['demos'][key]
    if numbers != recorded:
        diff = differences(data.get('recorded_with', {}))
        pytest.fail(
            f'the reduced demo {key!r} drifted from its recorded numbers '
            f'({osp.relpath(PATH, REPO)}):\n  recorded {recorded}\n  '
            f'now      {numbers}\n'
            + ('what differs from the recording:\n' + '\n'.join(diff)
               if diff else 'the packages are the pinned ones: the code '
               'changed the numbers (or the CPU kind did)')
            + '\nA clean install (make install, constraints.txt) gives the '
            'recorded numbers; a deliberate change records them again (the '
            'docstring of tests/demo/recorded.py).')
