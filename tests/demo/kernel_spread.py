"""How far the reduced demos' numbers move with the kernel path, and that
the pin holds them: every kernel path this machine can take, one run each.

    .venv/bin/python tests/demo/kernel_spread.py [--jobs 2] [--write]
        [--keys seg cls] [--work-dir work_dirs/kernel_spread]

Runs ``recorded.REDUCED`` (the reduced demos the tests compare with
``recorded_numbers.json``) unpinned (``--native-kernels``) under each of
:func:`paths` (ATen ``default``/``avx2``/``avx512``, oneDNN and MKL capped
at AVX2 and below, NumPy's and OpenCV's AVX-512 dispatch off, all of them
at AVX2 at once as an AVX2-only processor would run, two threads), and
pinned (the default) under the same ambient variables; then the tests
that compare with numbers recorded elsewhere (:data:`TESTS`) under each
path. It prints, per recorded number, the unpinned spread, whether every
pinned run equals the recording, and each test's outcome per path;
``--write`` stores the runs and the spread under ``spread`` in
``recorded_numbers.json`` (``tests/demo/test_recorded.py`` checks their
shape). Exit status 1 when a pinned run differs from the recording or a
test fails on some path. One thread a run; ``--jobs`` runs side by side.
"""
import argparse
import concurrent.futures
import datetime
import os
import os.path as osp
import platform
import shutil
import subprocess
import sys
import time

import recorded

from demo_data import kernel_paths

#: tests (besides the reduced demos) that compare with numbers recorded on
#: another machine: each must pass under every path
TESTS = ['tests/tools/test_check_setup.py::'
         'test_stand_in_passes_against_its_recorded_numbers']
#: the variables a path may set: unset in the base environment
PATH_VARIABLES = tuple(kernel_paths.PINNED) + kernel_paths.CLEARED + (
    'OPENCV_CPU_DISABLE', kernel_paths.MARK)


def paths(flags=None):
    """``{name: variables}``: the kernel paths this processor can take
    (over one thread unless the name says otherwise)."""
    isa = kernel_paths.instruction_set(flags)
    avx512 = isa == 'AVX512'
    npy_no512 = 'X86_V4 AVX512_ICL AVX512_SPR'
    cv_no512 = dict(OPENCV_CPU_DISABLE='AVX512F,AVX512-SKX') if avx512 \
        else {}
    out = {'native': {}}
    if (os.cpu_count() or 1) >= 2:
        out['native-2-threads'] = dict(OMP_NUM_THREADS='2',
                                       MKL_NUM_THREADS='2')
    if avx512:
        out['aten-avx512'] = dict(ATEN_CPU_CAPABILITY='avx512')
    if isa in ('AVX512', 'AVX2'):
        out['aten-avx2'] = dict(ATEN_CPU_CAPABILITY='avx2')
    out['aten-default'] = dict(ATEN_CPU_CAPABILITY='default')
    if isa in ('AVX512', 'AVX2'):
        out['onednn-avx2'] = dict(ONEDNN_MAX_CPU_ISA='AVX2')
    out['onednn-sse41'] = dict(ONEDNN_MAX_CPU_ISA='SSE41')
    if isa in ('AVX512', 'AVX2'):
        out['mkl-avx2'] = dict(MKL_ENABLE_INSTRUCTIONS='AVX2')
    out['mkl-sse4.2'] = dict(MKL_ENABLE_INSTRUCTIONS='SSE4_2')
    out['mkl-compatible'] = dict(MKL_CBWR='COMPATIBLE,STRICT')
    if avx512:
        out['numpy-opencv-no-avx512'] = dict(
            NPY_DISABLE_CPU_FEATURES=npy_no512, OPENCV_IPP='avx2',
            **cv_no512)
        # what an AVX2-only processor runs, every library at once
        out['all-avx2'] = dict(
            ATEN_CPU_CAPABILITY='avx2', ONEDNN_MAX_CPU_ISA='AVX2',
            MKL_ENABLE_INSTRUCTIONS='AVX2', OPENBLAS_CORETYPE='Haswell',
            NPY_DISABLE_CPU_FEATURES=npy_no512, OPENCV_IPP='avx2',
            **cv_no512)
    out['all-lowest'] = dict(
        ATEN_CPU_CAPABILITY='default', ONEDNN_MAX_CPU_ISA='SSE41',
        MKL_ENABLE_INSTRUCTIONS='SSE4_2', OPENBLAS_CORETYPE='Nehalem',
        NPY_DISABLE_CPU_FEATURES='X86_V3 ' + npy_no512, OPENCV_IPP='sse42',
        OPENCV_CPU_DISABLE=kernel_paths.opencv_disable(flags))
    return out


def base_env():
    env = {k: v for k, v in os.environ.items() if k not in PATH_VARIABLES}
    env.update(OMP_NUM_THREADS='1', MKL_NUM_THREADS='1',
               PYTHONUNBUFFERED='1')
    return env


def run_demo(key, name, env, work_root):
    """One reduced demo under ``env``: its numbers, or its failure."""
    work = osp.join(work_root, f'{key}_{name}')
    shutil.rmtree(work, ignore_errors=True)
    native = [] if name.startswith('pinned') else ['--native-kernels']
    start = time.time()
    proc = subprocess.run(recorded.reduced_command(key, work, extra=native),
                          cwd=recorded.REPO, env=env, capture_output=True,
                          text=True)
    if proc.returncode != 0:
        return key, name, None, (proc.stdout + proc.stderr)[-3000:], \
            time.time() - start
    return key, name, recorded.reduced_numbers(key, work), None, \
        time.time() - start


def run_test(node, name, env):
    proc = subprocess.run(
        [sys.executable, '-m', 'pytest', '-q', '-p', 'no:xdist',
         '-p', 'no:cacheprovider', node], cwd=recorded.REPO, env=env,
        capture_output=True, text=True)
    return node, name, proc.returncode, proc.stdout[-1500:]


def flat(tree, where=''):
    """``[(place, number)]`` of a JSON-like tree, in order."""
    if isinstance(tree, dict):
        return [p for k in sorted(tree) for p in
                flat(tree[k], f'{where}.{k}' if where else k)]
    if isinstance(tree, list):
        return [p for i, v in enumerate(tree)
                for p in flat(v, f'{where}[{i}]')]
    return [(where, tree)]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    p.add_argument('--keys', nargs='+', default=list(recorded.REDUCED),
                   choices=list(recorded.REDUCED))
    p.add_argument('--jobs', type=int, default=min(2, os.cpu_count() or 1))
    p.add_argument('--work-dir', default=osp.join(
        recorded.REPO, 'work_dirs', 'kernel_spread'))
    p.add_argument('--no-tests', action='store_true',
                   help='the reduced demos only')
    p.add_argument('--write', action='store_true',
                   help='store the runs and the spread in '
                   'recorded_numbers.json')
    args = p.parse_args(argv)
    start = time.time()
    base = base_env()
    unpinned = {name: dict(base, **v) for name, v in paths().items()}
    # the pin under the ambient variables of three paths: the pin replaces
    # them, so these are one environment, run thrice to show it
    ambient = [n for n in ('native', 'all-avx2', 'native-2-threads')
               if n in unpinned]
    pinned = {('pinned' if n == 'native' else f'pinned-under-{n}'):
              kernel_paths.pinned_env(unpinned[n]) for n in ambient}
    assert len({tuple(sorted(e.items())) for e in pinned.values()}) == 1
    envs = dict(unpinned, **pinned)
    data = recorded.load()
    jobs = [(key, name) for key in args.keys for name in envs]
    results, failed = {}, []
    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
        futures = [pool.submit(run_demo, key, name, envs[name],
                               args.work_dir) for key, name in jobs]
        if not args.no_tests:
            futures += [pool.submit(run_test, node, name, unpinned[name])
                        for node in TESTS for name in unpinned]
        for future in concurrent.futures.as_completed(futures):
            out = future.result()
            if len(out) == 5:
                key, name, numbers, error, seconds = out
                print(f'[{time.time() - start:6.0f}s] {key} {name}: '
                      f'{"failed" if error else "done"} ({seconds:.0f} s)',
                      flush=True)
                if error:
                    failed.append(f'{key} {name}:\n{error}')
                else:
                    results.setdefault(key, {})[name] = numbers
            else:
                node, name, rc, tail = out
                print(f'[{time.time() - start:6.0f}s] {node} {name}: '
                      f'{"passed" if rc == 0 else "FAILED"}', flush=True)
                if rc != 0:
                    failed.append(f'{node} under {name}:\n{tail}')
    wall = time.time() - start
    report = {}
    for key in args.keys:
        runs = results.get(key, {})
        numbers = data['demos'][key]
        off = [n for n in runs if not n.startswith('pinned')]
        spread = recorded.spread([runs[n] for n in off]) if off else None
        bad = [n for n in runs if n.startswith('pinned')
               and recorded.differing(runs[n], numbers)]
        failed += [f'{key} {n}: differs from the recording:\n  ' +
                   '\n  '.join(recorded.differing(runs[n], numbers))
                   for n in bad]
        print(f'\n== {key}: per recorded number, the recording, the '
              f'unpinned runs\' min..max ({len(off)} paths) and spread; '
              f'pinned runs equal to the recording: '
              f'{sum(n.startswith("pinned") for n in runs) - len(bad)}/'
              f'{sum(n.startswith("pinned") for n in runs)}')
        for place, value in flat(numbers):
            values = [v for n in off for q, v in flat(runs[n]) if q == place]
            if values and all(isinstance(v, (int, float)) for v in values):
                moved = [n for n in off if dict(flat(runs[n]))[place] !=
                         value]
                print(f'  {place:28s} {value!s:>10} '
                      f'{min(values)!s:>10}..{max(values)!s:<10} '
                      f'spread {max(values) - min(values):.6g}'
                      + (f'  (moved: {", ".join(moved)})' if moved else ''))
        report[key] = dict(
            how=('tests/demo/kernel_spread.py: recorded.REDUCED[%r] once per '
                 'kernel path (one thread unless named), unpinned '
                 '(--native-kernels) and pinned (the pin under the ambient '
                 'variables of the paths named pinned-under-*); spread = max '
                 '- min over the unpinned runs, per number' % key),
            machine=f'{recorded.cpu_model()}, {kernel_paths.instruction_set()}'
            f', {os.cpu_count()} cores, Python {platform.python_version()}',
            date=datetime.date.today().isoformat(),
            # the pin its pinned runs ran (test_recorded compares them with
            # the recording only under the pin of today)
            kernel_paths=kernel_paths.describe(True),
            wall_s=round(wall), paths={n: paths().get(n, 'the pin')
                                       for n in runs},
            runs=runs, spread=spread)
    print(f'\nwall time {wall / 60:.1f} min, {args.jobs} jobs')
    if failed:
        print('\nFAILED:\n' + '\n'.join(failed))
    if args.write and not failed:
        data = recorded.load()
        data.setdefault('spread', {}).update(report)
        recorded.save(data)
        print(f'written: {recorded.PATH} (spread)')
    return 1 if failed else 0


if __name__ == '__main__':
    sys.exit(main())
