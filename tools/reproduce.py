"""One command per table of the paper: run each of its configs with
``tools/test.py``, then turn the finished runs into the table with
``tools/collect_results.py``::

    python tools/reproduce.py TABLE --checkpoint CKPT --data-root DIR
        --work-root DIR [--only NAME ...] [--preset bf16-graph]
        [--launcher local|ray] [--checkpoint-for METHOD=CKPT ...]
        [--source-data-root DIR] [--cfg-options k=v ...] [--allow-short]
        [--dry-run] [--address HOST:PORT] [--num-cpus N] [--gpus-per-run G]
        [--cpus-per-run C] [--max-concurrent N]
    python tools/reproduce.py --list

A table is ``table9`` (Cityscapes -> ACDC, the NVlabs SegFormer-B5) or one
model of a classification table, ``<benchmark>_<scenario>_<model>`` (one
checkpoint each); its configs are the shipped configs whose names
(``tools/paper_tables.py``'s ``setting_of``) match a score of
:data:`mmseg_stag.paper_results.PAPER_RESULTS`. Each config runs into
``WORK_ROOT/<config stem>``: one after another, a process each
(``--launcher local``), or as Ray trials through ``tools/sweep.py``
(``--launcher ray``). A finished run is skipped, an interrupted one resumed
(``--resume``), a failed one reported while the others go on; the table is
written to ``WORK_ROOT/table``. The exit status is 0 when every run
finished and collect_results.py, where it ran, succeeded.
docs/reproduce.md says more.
"""
import argparse
import glob
import importlib.util
import os
import os.path as osp
import shlex
import subprocess
import sys
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Dict, List, Optional

TOOLS = osp.dirname(osp.abspath(__file__))
REPO = osp.dirname(TOOLS)
# the package (not installed in a checkout) and the table logic beside this
# script (tools/ is no package: a script loaded by path still finds it)
for path in (REPO, TOOLS):
    if path not in sys.path:
        sys.path.insert(0, path)
TEST_PY = osp.join(REPO, 'tools', 'test.py')
COLLECT_PY = osp.join(REPO, 'tools', 'collect_results.py')
SWEEP_PY = osp.join(REPO, 'tools', 'sweep.py')
#: where the tables' configs are looked for (a test points it elsewhere)
CONFIG_ROOT = osp.join(REPO, 'configs')
#: the run state and results of tools/test.py (mmseg_stag.engine's
#: STATE_FILE and RESULTS_FILE; spelled here so that --list and --dry-run
#: import no torch)
STATE_FILE = 'online_adaptation_state.pth'
RESULTS_FILE = 'continual_results.json'
#: the fast presets: the suffix of a config's sibling (docs/running.md)
PRESETS = {'bf16-graph': '_bf16-graph'}
#: the paper's table that holds a benchmark's scenario (its LaTeX numbers,
#: docs/reproduce.md); only labels: the configs come from the files
PAPER_TABLE = {('acdc', 'continual'): 'Table 9',
               ('imagenet-c', 'mild'): 'Table 1',
               ('imagenet-c', 'mixed'): 'Table 2',
               ('imagenet-c', 'label-shift'): 'Table 3',
               ('imagenet-c', 'bs1'): 'Table 3',
               ('cifar10-c', 'continual'): 'Table 4 (7)',
               ('cifar100-c', 'continual'): 'Table 4 (8)'}
#: the paper's ACDC table has one model, so one command: its short name
ALIASES = {'table9': 'acdc_continual_segformer-b5'}
#: the setting that says where a benchmark's test images are
DATA_ROOT_KEYS = {'acdc': 'test_dataloader.dataset.data_root'}
CORRUPTION_ROOT_KEY = 'test_dataloader.dataset.corruption_set.data_root'
#: EATA's clean source images (configs with a source_dataloader)
SOURCE_ROOT_KEY = 'test_cfg.source_dataloader.dataset.images.data_root'


@dataclass
class Table:
    """One model's configs of a table of the paper, in PAPER_RESULTS'
    order; ``missing``: the paper's scores that have no config on disk."""
    name: str
    benchmark: str
    scenario: str
    model: str
    configs: List[str] = field(default_factory=list)
    missing: List[str] = field(default_factory=list)

    @property
    def paper(self) -> str:
        return PAPER_TABLE.get((self.benchmark, self.scenario),
                               f'{self.benchmark} {self.scenario}')


def shown(path: str) -> str:
    """A path as the user reads it: from the repository when in it."""
    rel = osp.relpath(path, REPO)
    return path if rel.startswith('..') else rel


def label(config: str) -> str:
    """A config's method as its file name spells it: ``tent-stag``."""
    return osp.splitext(osp.basename(config))[0].rsplit('_', 1)[-1]


def find_tables(config_root: Optional[str] = None) -> Dict[str, Table]:
    """Every table of :data:`PAPER_RESULTS` by name
    (``<benchmark>_<scenario>_<model>``), with the configs under
    ``config_root`` whose names say its settings."""
    from mmseg_stag.paper_results import PAPER_RESULTS
    from paper_tables import setting_of
    root = config_root or CONFIG_ROOT
    found: Dict[tuple, List[str]] = {}
    for path in sorted(glob.glob(osp.join(root, '**', '*.py'),
                                 recursive=True)):
        setting = setting_of(osp.basename(path))
        if setting is None or '_base_' in path.split(os.sep) or any(
                path.endswith(suffix + '.py') for suffix in PRESETS.values()):
            continue  # a preset's sibling runs with --preset
        key = tuple(setting[k] for k in ('benchmark', 'scenario', 'model',
                                         'method', 'stag'))
        found.setdefault(key, []).append(osp.abspath(path))
    tables: Dict[str, Table] = OrderedDict()
    for benchmark, scenario, model, method, plain, stag in PAPER_RESULTS:
        name = f'{benchmark}_{scenario}_{model}'
        table = tables.setdefault(name, Table(name, benchmark, scenario,
                                              model))
        for with_stag, score in ((False, plain), (True, stag)):
            if score is None:  # no such row in the paper
                continue
            paths = found.get((benchmark, scenario, model, method,
                               with_stag), [])
            what = f'{method}{"+STAG" if with_stag else ""}'
            if len(paths) == 1:
                table.configs.append(paths[0])
            else:
                table.missing.append(
                    f'{what}: ' + (f'{len(paths)} configs ('
                                   f'{", ".join(map(shown, paths))})'
                                   if paths else 'no config'))
    return tables


def list_tables(tables: Dict[str, Table]) -> str:
    aliases = {v: k for k, v in ALIASES.items()}
    lines = []
    order = list(PAPER_TABLE)  # the paper's order, then the scenario's
    for table in sorted(tables.values(), key=lambda t: order.index(
            (t.benchmark, t.scenario)) if (t.benchmark, t.scenario) in order
            else len(order)):
        also = f' (or {aliases[table.name]})' if table.name in aliases else ''
        lines.append(f'{table.name}{also}: {table.paper}, '
                     f'{len(table.configs)} configs')
        lines += [f'    {shown(c)}' for c in table.configs]
        lines += [f'    missing {m}' for m in table.missing]
    return '\n'.join(lines)


def choose_table(name: str, tables: Dict[str, Table]) -> Table:
    table = tables.get(ALIASES.get(name, name))
    if table is None:
        by_paper = [t.name for t in tables.values()
                    if t.paper.lower().replace(' ', '').startswith(
                        name.lower())]
        hint = (f'{name} is run one model at a time (each its own '
                f'checkpoint): {", ".join(by_paper)}' if by_paper else
                'the tables: ' + ', '.join(list(ALIASES) + list(tables)))
        raise SystemExit(f'error: no table {name!r}; {hint} (--list shows '
                         'their configs)')
    if table.missing:
        raise SystemExit(
            f'error: table {table.name} ({table.paper}) lacks configs for '
            f'the paper\'s scores: {"; ".join(table.missing)} (under '
            f'{shown(CONFIG_ROOT)})')
    return table


# -- the plan ------------------------------------------------------------
@dataclass
class Run:
    """One config of the table as it will run."""
    label: str
    config: str  # the file that runs (the preset's where asked)
    faithful: str  # the table's config (absolute paths both)
    checkpoint: str
    work_dir: str
    options: List[str]
    state: str = 'new'  # new | interrupted | finished

    def command(self) -> List[str]:
        cmd = [sys.executable, TEST_PY, self.config, self.checkpoint,
               '--work-dir', self.work_dir]
        if self.state == 'interrupted':
            cmd.append('--resume')
        return cmd + (['--cfg-options'] + self.options if self.options
                      else [])


def run_state(work_dir: str) -> str:
    """``finished`` (complete results, a run state at the stream's end or
    none), ``interrupted`` (a run state short of the end: ``--resume``
    continues it) or ``new``.

    Raises:
        SystemExit: For results of another schema, or a run state that
            cannot be read (a rerun would overwrite what is there).
    """
    state_path = osp.join(work_dir, STATE_FILE)
    if osp.isfile(state_path):
        from mmseg_stag.engine.run_state import load_run_state
        try:
            state = load_run_state(state_path, mmap=True)
        except RuntimeError as err:
            raise SystemExit(f'error: {state_path}: {err}; move the work '
                             'dir away to run it again') from None
        if state.get('batches_done') != state.get('num_batches'):
            # a stale results file of an earlier run does not count
            return 'interrupted'
    if not osp.isfile(osp.join(work_dir, RESULTS_FILE)):
        return 'new'
    from mmseg_stag.engine.report import read_results
    try:
        read_results(work_dir)
    except ValueError as err:
        raise SystemExit(f'error: {err}') from None
    return 'finished'


def parse_pairs(words: List[str], what: str) -> Dict[str, str]:
    pairs = OrderedDict()
    for word in words:
        key, sep, value = word.partition('=')
        if not sep or not key or not value:
            raise SystemExit(f'error: {what} {word!r} is not KEY=VALUE')
        pairs[key] = value
    return pairs


def plan(table: Table, args) -> List[Run]:
    """The runs of ``table`` as ``args`` asks, each with its state; every
    file and choice checked before anything runs."""
    configs = table.configs
    if args.only:
        labels = [label(c) for c in configs]
        unknown = [n for n in args.only if n not in labels]
        if unknown:
            raise SystemExit(f'error: --only {" ".join(unknown)}: not a '
                             f'config of {table.name} (its: '
                             f'{", ".join(labels)})')
        configs = [c for c in configs if label(c) in args.only]
    for path in [args.checkpoint] + list(args.checkpoint_for.values()):
        if not osp.isfile(path):
            raise SystemExit(f'error: checkpoint not found: {path}')
    for what, path in (('--data-root', args.data_root),
                       ('--source-data-root', args.source_data_root)):
        if path is not None and not osp.isdir(path):
            raise SystemExit(f'error: {what} {path}: no such directory')
    methods = {label(c)[:-len('-stag')] if label(c).endswith('-stag')
               else label(c) for c in configs}
    unknown = sorted(set(args.checkpoint_for) - methods)
    if unknown:
        raise SystemExit(f'error: --checkpoint-for {", ".join(unknown)}: no '
                         f'such method among the runs of {table.name} '
                         f'({", ".join(sorted(methods))})')
    # EcoTTA starts from meta networks warmed up on source data; the
    # source checkpoint has none and tools/test.py refuses it
    cold = sorted(m for m in methods if m.startswith('ecotta') and
                  m not in args.checkpoint_for)
    if cold:
        raise SystemExit(
            f'error: {table.name}: {", ".join(cold)} (and -stag) start from '
            'their warmed-up meta networks (tools/ecotta_warmup.py): give '
            '--checkpoint-for ' + ' '.join(f'{m}=FILE' for m in cold) +
            ', or leave them out with --only')
    data_key = DATA_ROOT_KEYS.get(table.benchmark, CORRUPTION_ROOT_KEY)
    common = [f'{data_key}={osp.abspath(args.data_root)}'] + \
        list(args.cfg_options)
    parse_pairs(args.cfg_options, '--cfg-options')
    suffix = PRESETS.get(args.preset, '')
    runs, reads_source = [], False
    for faithful in configs:
        config = faithful
        if suffix:
            sibling = faithful[:-len('.py')] + suffix + '.py'
            if osp.isfile(sibling):
                config = sibling
        method = label(faithful)[:-len('-stag')] \
            if label(faithful).endswith('-stag') else label(faithful)
        options = list(common)
        if args.source_data_root and needs_source(faithful):
            reads_source = True
            # after the data root, before the user's: theirs win
            options.insert(1, f'{SOURCE_ROOT_KEY}='
                           f'{osp.abspath(args.source_data_root)}')
        stem = osp.splitext(osp.basename(config))[0]
        work_dir = osp.join(osp.abspath(args.work_root), stem)
        runs.append(Run(label(faithful), config, faithful,
                        osp.abspath(args.checkpoint_for.get(
                            method, args.checkpoint)),
                        work_dir, options, run_state(work_dir)))
    if args.source_data_root and not reads_source:
        raise SystemExit(f'error: --source-data-root: no run of '
                         f'{table.name} reads clean source images (only '
                         'EATA\'s configs do)')
    return runs


def needs_source(config: str) -> bool:
    """Whether a config reads clean source images (EATA's Fisher)."""
    from mmengine.config import Config
    cfg = Config.fromfile(config)
    return bool((cfg.get('test_cfg') or {}).get('source_dataloader'))


def describe(table: Table, runs: List[Run], args) -> str:
    lines = [f'{table.name} ({table.paper}): {len(runs)} run(s) into '
             f'{osp.abspath(args.work_root)}']
    for run in runs:
        how = {'new': 'runs', 'interrupted': 'resumes (--resume)',
               'finished': 'finished: skipped'}[run.state]
        preset = ''
        if args.preset:
            preset = (f', preset {args.preset}' if run.config !=
                      run.faithful else f', faithful: {shown(run.faithful)} '
                      f'has no {PRESETS[args.preset]} sibling')
        lines.append(f'  {run.label}: {how}{preset}')
    return '\n'.join(lines)


# -- running -------------------------------------------------------------
def run_local(runs: List[Run], dry_run: bool) -> None:
    """Each run in its own ``tools/test.py`` process (a crash or a kill
    ends that run only), its output appended to ``WORK_DIR/run.log`` as
    tools/sweep.py does."""
    for run in runs:
        if run.state == 'finished':
            continue
        cmd = run.command()
        print(f'[reproduce] {run.label}: {shlex.join(cmd)}', flush=True)
        if dry_run:
            continue
        os.makedirs(run.work_dir, exist_ok=True)
        log_path = osp.join(run.work_dir, 'run.log')
        with open(log_path, 'a') as log:
            log.write(shlex.join(cmd) + '\n')
            log.flush()
            done = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT,
                                  cwd=REPO)
        how = 'finished' if done.returncode == 0 else (
            f'killed by signal {-done.returncode}' if done.returncode < 0
            else f'exit code {done.returncode}')
        print(f'[reproduce] {run.label}: {how} (log: {log_path})',
              flush=True)


def load_sweep():
    spec = importlib.util.spec_from_file_location('_reproduce_sweep',
                                                  SWEEP_PY)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_ray(runs: List[Run], args) -> None:
    """The runs not finished, as trials of tools/sweep.py's Ray runner
    (its resources, environment and gathered table), each in its work dir
    ``WORK_ROOT/<config stem>``, the sweep's files in ``WORK_ROOT``."""
    todo = [r for r in runs if r.state != 'finished']
    for run in todo:
        print(f'[reproduce] {run.label} on Ray: {shlex.join(run.command())}',
              flush=True)
    if args.dry_run or not todo:
        return
    sweep = load_sweep()
    # the options every run shares go through the sweep's --cfg-options
    # (it reads their num_workers for the CPUs a run holds); EATA's
    # source images are a run's own
    shared = todo[0].options
    argv = ['--work-dir', args.work_root, '--resume', '--cfg-options',
            *[o for o in shared if not o.startswith(SOURCE_ROOT_KEY)]]
    for flag in ('address', 'num_cpus', 'gpus_per_run', 'cpus_per_run',
                 'max_concurrent'):
        value = getattr(args, flag)
        if value is not None:
            argv += ['--' + flag.replace('_', '-'), str(value)]
    sweep_args = sweep.parse_args(argv)
    sweep.check_address(sweep_args.address)
    trials = [dict(name=osp.basename(r.work_dir), config=r.config,
                   checkpoint=r.checkpoint, seed=None, overrides={},
                   options=[o for o in r.options
                            if o.startswith(SOURCE_ROOT_KEY)],
                   work_dir=r.work_dir) for r in todo]
    sweep.check_runs(trials, sweep_args)
    sweep.run_on_ray(trials, sweep_args)


# -- the table -----------------------------------------------------------
def collect_command(runs: List[Run], args) -> List[str]:
    cmd = [sys.executable, COLLECT_PY] + [r.work_dir for r in runs] + [
        '--out', osp.join(osp.abspath(args.work_root), 'table')]
    return cmd + (['--allow-short'] if args.allow_short else [])


def collect(runs: List[Run], args) -> bool:
    """The table of the finished runs in ``WORK_ROOT/table``; False if
    collect_results.py failed (it marks a preset's rows)."""
    cmd = collect_command(runs, args)
    print(f'[reproduce] {shlex.join(cmd)}', flush=True)
    if args.dry_run:
        return True
    done = subprocess.run(cmd, cwd=REPO)
    if done.returncode != 0:
        print(f'[reproduce] collect_results.py failed (exit code '
              f'{done.returncode})', flush=True)
        return False
    print(f'[reproduce] the table: {cmd[cmd.index("--out") + 1]}/'
          'paper_table.md (.csv, .json, .png)', flush=True)
    return True


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description="run a table of the paper and collect it")
    add = parser.add_argument
    add('table', nargs='?', help='table9, or <benchmark>_<scenario>_<model> '
        'of a classification table (--list)')
    add('--list', action='store_true', help='the tables and their configs')
    add('--checkpoint', help='the source model\'s checkpoint')
    add('--data-root', help='the benchmark\'s test images (ACDC: '
        'test_dataloader.dataset.data_root; ImageNet-C, CIFAR-C: '
        '...corruption_set.data_root)')
    add('--work-root', help='WORK_ROOT/<config stem> per run, '
        'WORK_ROOT/table for the table')
    add('--only', nargs='+', metavar='NAME', help='only these configs of '
        'the table, by the method their file names end with (source, '
        'tent-stag, ...)')
    add('--preset', choices=sorted(PRESETS), help='run each config\'s '
        'fast sibling (<stem>_bf16-graph.py, one CUDA GPU) where it has '
        'one, the faithful config where not')
    add('--launcher', choices=['local', 'ray'], default='local',
        help='local: one run after another, a process each; ray: all '
        'through tools/sweep.py (the .[sweep] extra)')
    add('--checkpoint-for', nargs='+', default=[], metavar='METHOD=CKPT',
        help='another checkpoint for a method and its +STAG config '
        '(EcoTTA: its warmed-up meta networks, ecotta-k4=FILE)')
    add('--source-data-root', help='clean source images of EATA\'s configs '
        '(test_cfg.source_dataloader.dataset.images.data_root)')
    add('--cfg-options', nargs='+', default=[], metavar='KEY=VALUE',
        help='settings of every run (tools/test.py --cfg-options)')
    add('--allow-short', action='store_true', help='passed to '
        'collect_results.py: collect runs shorter than the paper\'s '
        'protocol (marked so)')
    add('--dry-run', action='store_true', help='print the commands, run '
        'nothing')
    ray = parser.add_argument_group('--launcher ray (tools/sweep.py)')
    ray.add_argument('--address', help='a running Ray cluster')
    ray.add_argument('--num-cpus', type=int, help='CPUs of a local Ray')
    ray.add_argument('--gpus-per-run', type=float)
    ray.add_argument('--cpus-per-run', type=float)
    ray.add_argument('--max-concurrent', type=int)
    args = parser.parse_args(argv)
    if not args.list:
        missing = [f'--{k.replace("_", "-")}' for k in
                   ('checkpoint', 'data_root', 'work_root')
                   if getattr(args, k) is None]
        if args.table is None or missing:
            parser.error('give TABLE ' + ' '.join(f'{m} ...' for m in
                         missing) + ' (or --list)')
    args.checkpoint_for = parse_pairs(args.checkpoint_for,
                                      '--checkpoint-for')
    if args.launcher == 'local':
        given = [f'--{k.replace("_", "-")}' for k in (
            'address', 'num_cpus', 'gpus_per_run', 'cpus_per_run',
            'max_concurrent') if getattr(args, k) is not None]
        if given:
            parser.error(f'{", ".join(given)}: only with --launcher ray')
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    tables = find_tables()
    if args.list:
        print(list_tables(tables))
        return 0
    table = choose_table(args.table, tables)
    runs = plan(table, args)
    print(describe(table, runs, args), flush=True)
    if args.launcher == 'ray':
        run_ray(runs, args)
    else:
        run_local(runs, args.dry_run)
    if args.dry_run:
        collect(runs, args)
        return 0
    states = {r.label: run_state(r.work_dir) for r in runs}
    failed = [name for name, state in states.items() if state != 'finished']
    if failed:
        print(f'[reproduce] not finished: {", ".join(failed)} (their '
              'run.log); run the same command again to resume them; no '
              'table', flush=True)
        return 1
    print(f'[reproduce] all {len(runs)} runs finished', flush=True)
    return 0 if collect(runs, args) else 1


if __name__ == '__main__':
    sys.exit(main())
