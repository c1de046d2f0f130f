"""The reduced demos' numbers, recorded: a clean install whose numbers
drift from them fails, naming what differs from the recording.

The demos train their source models on the CPU, and a CPU's kernels round
differently from one processor family to the next (AMD and Intel cores take
other vector paths through oneDNN and the BLAS): the same code and pins give
numbers that differ in their last digits, and a training run carries those
differences on. So the check has two strengths:

* on the recording's own processor family (``recorded_with.vendor``) it is
  exact: a package that moves (numpy, Pillow, OpenCV, SciPy, scikit-image,
  torch) or a change of the code changes the numbers;
* on another family it holds each number within the tolerance that
  ``recorded_numbers.json`` states under ``cross_family`` beside the
  differences it was measured from, and says so in its message. The
  tolerance is a few times the differences measured between families and
  well below the distance between two methods' numbers, so a real change
  of a method still fails (tests/demo/test_recorded.py checks both).

The pins of ``constraints.txt`` keep a clean install on the recorded
numbers; the demos run with one torch thread (``ENV``), so the core count
of the machine does not change a reduction's order. After a deliberate
change of the numbers (a pin, a method), record them again on a machine of
the recording's family (the message names it)::

    MMSEG_STAG_RECORD_NUMBERS=1 .venv/bin/python -m pytest tests/demo \
        -k reduced_demo
"""
import importlib.metadata
import json
import os
import os.path as osp
import platform
import re
from typing import List, Optional

import pytest

REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
PATH = osp.join(REPO, 'tests', 'demo', 'recorded_numbers.json')
CONSTRAINTS = osp.join(REPO, 'constraints.txt')
RECORD = os.environ.get('MMSEG_STAG_RECORD_NUMBERS') == '1'
#: the demos' subprocesses: one intra-op thread whatever the machine
ENV = dict(os.environ, OMP_NUM_THREADS='1', MKL_NUM_THREADS='1')
#: ``/proc/cpuinfo``'s vendor ids, and the family a model name tells
VENDORS = {'AuthenticAMD': 'AMD', 'GenuineIntel': 'Intel'}


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


def cpuinfo_field(field: str) -> Optional[str]:
    """The first ``field`` of ``/proc/cpuinfo`` (None where there is none)."""
    try:
        with open('/proc/cpuinfo') as f:
            for line in f:
                if line.split(':', 1)[0].strip() == field:
                    return line.split(':', 1)[1].strip()
    except OSError:
        pass
    return None


def cpu_model() -> str:
    # the name a run's provenance gives its CPU
    import torch

    from mmseg_stag.engine.provenance import device_name
    return device_name(torch.device('cpu'))


def processor_family(vendor: Optional[str], model: Optional[str]) -> str:
    """``'AMD'``, ``'Intel'`` or the vendor id as it is (``'unknown'``
    without one); a recording without a vendor id is named by its model."""
    if vendor:
        return VENDORS.get(vendor, vendor)
    for family in VENDORS.values():
        if model and family.lower() in model.lower():
            return family
    return 'unknown'


def environment():
    """What the numbers were recorded with."""
    import torch
    return dict(python=platform.python_version(), torch=torch.__version__,
                machine=platform.machine(), processor=cpu_model(),
                vendor=cpuinfo_field('vendor_id') or 'unknown',
                constraints='constraints.txt')


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


def beyond_tolerance(numbers, recorded, tolerance: float,
                     where: str = '') -> List[str]:
    """The places (``'rows.TENT[3]: 11 vs 13'``) where two JSON-like trees
    of numbers differ by more than ``tolerance`` (absolute), or differ in
    shape, keys or a non-number; empty when they agree within it."""
    if isinstance(recorded, dict) and isinstance(numbers, dict):
        if set(numbers) != set(recorded):
            return [f'{where or "top"}: keys {sorted(numbers)} vs '
                    f'{sorted(recorded)}']
        return [line for key in sorted(recorded) for line in beyond_tolerance(
            numbers[key], recorded[key], tolerance,
            f'{where}.{key}' if where else str(key))]
    if isinstance(recorded, list) and isinstance(numbers, list):
        if len(numbers) != len(recorded):
            return [f'{where}: {len(numbers)} numbers vs {len(recorded)}']
        return [line for i, (a, b) in enumerate(zip(numbers, recorded))
                for line in beyond_tolerance(a, b, tolerance, f'{where}[{i}]')]
    numeric = (int, float)
    if isinstance(numbers, numeric) and isinstance(recorded, numeric) and \
            not isinstance(numbers, bool) and not isinstance(recorded, bool):
        if abs(numbers - recorded) <= tolerance:
            return []
    elif numbers == recorded:
        return []
    return [f'{where}: {numbers} vs {recorded}']


def load():
    if not osp.isfile(PATH):
        return {}
    with open(PATH) as f:
        return json.load(f)


def record(key, numbers):
    data = load()
    data.setdefault('demos', {})[key] = numbers
    data['recorded_with'] = environment()
    text = json.dumps(data, indent=1, sort_keys=True)
    # one line per list of numbers
    text = re.sub(r'\[[^\[\]{}"]*\]',
                  lambda m: ' '.join(m.group(0).split()), text)
    with open(PATH, 'w') as f:
        f.write(text + '\n')


def drift_message(key, numbers, data) -> Optional[str]:
    """Why ``numbers`` do not hold as the recording of ``key`` on this
    machine's processor family (None when they hold)."""
    recorded = data['demos'][key]
    recorded_env = data.get('recorded_with', {})
    family = processor_family(recorded_env.get('vendor'),
                              recorded_env.get('processor'))
    here = processor_family(cpuinfo_field('vendor_id'), cpu_model())
    rel = osp.relpath(PATH, REPO)
    if here == family:
        if numbers == recorded:
            return None
        diff = differences(recorded_env)
        places = beyond_tolerance(numbers, recorded, 0)
        return (
            f'the reduced demo {key!r} drifted from its recorded numbers '
            f'({rel}; exact on the recording\'s processor family, {family})'
            ', now vs recorded:\n  ' + '\n  '.join(places) + '\n'
            + ('what differs from the recording:\n' + '\n'.join(diff)
               if diff else 'the packages are the pinned ones: the code '
               'changed the numbers')
            + '\nA clean install (make install, constraints.txt) gives the '
            'recorded numbers; a deliberate change records them again (the '
            'docstring of tests/demo/recorded.py).')
    cross = data.get('cross_family', {}).get(key)
    if cross is None:
        return (f'{rel} states no cross-family tolerance for {key!r}: its '
                f'numbers were recorded on an {family} processor, this one is '
                f'{here} ({cpu_model()})')
    tolerance = cross['tolerance']
    if isinstance(tolerance, dict):  # one per top-level key (its unit)
        beyond = [line for name in sorted(set(recorded) | set(numbers))
                  for line in beyond_tolerance(
                      numbers.get(name), recorded.get(name),
                      tolerance.get(name, 0), name)]
    else:
        beyond = beyond_tolerance(numbers, recorded, tolerance)
    if not beyond:
        return None
    return (
        f'the reduced demo {key!r} drifted from its recorded numbers ({rel}) '
        f'beyond the rounding of another processor family: recorded on '
        f'{recorded_env.get("processor")} ({family}), run on {cpu_model()} '
        f'({here}), where each number may differ by up to {tolerance} '
        f'({cross["measured"]}); beyond it:\n  ' + '\n  '.join(beyond)
        + '\nwhat differs from the recording:\n'
        + '\n'.join(differences(recorded_env) or ['  nothing else']))


def check_or_record(key, numbers):
    """Compare ``numbers`` (JSON-able) with the recording under ``key``, or
    record them when ``MMSEG_STAG_RECORD_NUMBERS=1``."""
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
