"""One command per table of the paper: run each of its configs with
``tools/test.py``, then turn the finished runs into the table with
``tools/collect_results.py``::

    python tools/reproduce.py TABLE --checkpoint CKPT --data-root DIR
        [--work-root DIR] [--only NAME ...] [--preset fast]
        [--launcher local|ray] [--checkpoint-for METHOD=CKPT ...]
        [--source-data-root DIR] [--cfg-options k=v ...] [--allow-short]
        [--realtime COST|measure] [--seed S] [--seeds N] [--dry-run]
        [--progress-every SECONDS] [--address HOST:PORT]
        [--num-cpus N] [--gpus-per-run G] [--cpus-per-run C]
        [--max-concurrent N]
    python tools/reproduce.py --list

A table is ``table9`` (Cityscapes -> ACDC, the NVlabs SegFormer-B5) or one
model of a classification table, ``<benchmark>_<scenario>_<model>`` (one
checkpoint each); its configs are the shipped configs whose names
(``mmseg_stag/paper/tables.py``'s ``setting_of``) match a score of
:data:`mmseg_stag.paper.results.PAPER_RESULTS`; ``--preset fast`` runs
each config's fast sibling instead (``<stem>_bf16-graph.py`` or
``<stem>_bf16.py``, one CUDA GPU; refused before any run on a machine
without CUDA).

Each run goes where ``tools/test.py CONFIG CKPT`` puts it without
``--work-dir``: ``WORK_ROOT/<config stem>`` (``WORK_ROOT`` defaults to
``work_dirs``); ``--realtime COST`` (the realistic online protocol,
docs/realtime.md) puts it in ``WORK_ROOT/<config stem>_realtime-<COST>``
and ``--seeds N`` (seeds S..S+N-1, S the config's own seed or ``--seed``)
each seed but the config's own in ``..._seed<k>``, so that the offline,
the realistic and the seeded runs of a config live side by side. They run
one after another, a process each (``--launcher local``,
its progress on the console every ``--progress-every`` seconds), or as Ray
trials through ``tools/sweep.py`` (``--launcher ray``). The table goes to
its own folder, ``WORK_ROOT/tables/<table>[_<preset>][_realtime-<COST>]
[_seed<S>][_seeds<N>][_only-<a>+<b>...]``, so that a preset's, a
protocol's or a seed's table or an ``--only`` subset never replaces
another; with several seeds it shows each cell's mean ± standard
deviation.

Before anything runs, every work dir that already holds a run is
fingerprinted as ``--resume`` fingerprints it (the config after the
options, the seed and the protocol, the starting weights:
``mmseg_stag.engine.run_state``): a run of
this command's fingerprint is skipped when finished and resumed
(``--resume``) when interrupted; any other stops the command, naming the
work dir, the settings that differ and what to do. A failed run is
reported while the others go on. The exit status is 0 when every run
finished and collect_results.py, where it ran, succeeded.
``--help`` and argument errors answer without importing torch; ``--list``
and the rest import the package (and torch) for the table logic.
docs/reproduce.md says more.
"""
import argparse
import glob
import importlib.util
import json
import os
import os.path as osp
import re
import shlex
import subprocess
import sys
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Dict, List, Optional, Tuple

REPO = osp.dirname(osp.dirname(osp.abspath(__file__)))
if REPO not in sys.path:  # the package, not installed in a checkout
    sys.path.insert(0, REPO)
TEST_PY = osp.join(REPO, 'tools', 'test.py')
COLLECT_PY = osp.join(REPO, 'tools', 'collect_results.py')
SWEEP_PY = osp.join(REPO, 'tools', 'sweep.py')
#: where the tables' configs are looked for (a test points it elsewhere)
CONFIG_ROOT = osp.join(REPO, 'configs')
#: the run state and results of tools/test.py (mmseg_stag.engine's
#: STATE_FILE and RESULTS_FILE, a test holds them equal; spelled here so
#: that --help and argument errors answer before torch is imported)
STATE_FILE = 'online_adaptation_state.pth'
RESULTS_FILE = 'continual_results.json'
#: where a run goes without --work-root: tools/test.py's own default
#: without --work-dir (``mmseg_stag.engine.runs.prepare_config``:
#: ./work_dirs/<config stem>), so that a run made by hand is found here
DEFAULT_WORK_ROOT = 'work_dirs'
#: the tables' folder under WORK_ROOT (one subfolder per table, preset and
#: --only subset: never a run's <config stem>)
TABLES_DIR = 'tables'
#: the fast presets (mmseg_stag.engine.speed_options.PRESETS, docs/running.md)
#: and the suffixes of a config's sibling that is the preset: _bf16-graph
#: where the method's step is replayed as a CUDA graph (TENT, CoTTA and
#: their +STAG), _bf16 where it is not (Source, BN Adapt, BN Adapt+STAG);
#: a config has exactly one of them
PRESETS = {'fast': ('_bf16-graph', '_bf16')}
#: the line MMEngine's LogProcessor writes every default_hooks.logger
#: .interval batches of the test loop ("Iter(test) [ 50/16000]  eta: ..."),
#: and the images/s the online loop's log processor adds to it
ITER_LINE = re.compile(r'Iter\(test\)\s*\[\s*(\d+)/(\d+)\]')
IMAGES_PER_S = re.compile(r'images/s: ([0-9.]+)')
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
#: the settings --realtime and --seed/--seeds own (given as --cfg-options,
#: the runs would not get work dirs and tables of their own)
REALTIME_KEY = 'test_cfg.realtime'
SEED_KEY = 'randomness.seed'
#: the seeds MMEngine's set_random_seed takes (NumPy's)
MAX_SEED = 2**32 - 1


def realtime_cost(text: str):
    """``--realtime``'s value: a number > 0, or ``measure`` (as
    tools/test.py reads it: a tool imports no other tool;
    tests/tools/test_realtime_argument.py holds the copies equal)."""
    if text == 'measure':
        return text
    try:
        cost = float(text)
    except ValueError:
        cost = float('nan')
    if not cost > 0 or cost == float('inf'):
        raise argparse.ArgumentTypeError(
            f'{text!r}: a step\'s cost in forwards, a number > 0, or '
            'measure')
    return cost


def cost_text(cost) -> str:
    """A ``--realtime`` value as a work dir's name and tools/test.py's
    argument spell it: ``measure``, ``2.5``, ``3`` (every digit of the
    float: two costs never share a name)."""
    if cost == 'measure':
        return cost
    text = repr(float(cost))
    return text[:-2] if text.endswith('.0') else text


def run_suffix(realtime=None, seed: Optional[int] = None) -> str:
    """What a run's work dir adds to its config stem:
    ``_realtime-<cost>`` for the realistic protocol, ``_seed<k>`` for a
    seed other than the config's own."""
    return ('' if realtime is None else f'_realtime-{cost_text(realtime)}') \
        + ('' if seed is None else f'_seed{seed}')


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
    from mmseg_stag.paper.results import PAPER_RESULTS
    from mmseg_stag.paper.tables import setting_of
    root = config_root or CONFIG_ROOT
    found: Dict[tuple, List[str]] = {}
    for path in sorted(glob.glob(osp.join(root, '**', '*.py'),
                                 recursive=True)):
        setting = setting_of(osp.basename(path))
        if setting is None or '_base_' in path.split(os.sep) or any(
                path.endswith(suffix + '.py') for suffixes in
                PRESETS.values() for suffix in suffixes):
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


def short_name(table: Table) -> str:
    """The name a table is asked by: its alias where it has one."""
    aliases = {v: k for k, v in ALIASES.items()}
    return aliases.get(table.name, table.name)


def table_suffix(args) -> str:
    """What the protocol and the seeds add to a table's folder (and to
    its runs' work dirs, the seeds aside): ``_realtime-<cost>``,
    ``_seed<S>`` (``--seed``), ``_seeds<N>`` (``--seeds`` above 1)."""
    return run_suffix(args.realtime, args.seed) + (
        f'_seeds{args.seeds}' if args.seeds > 1 else '')


def table_dir(table: Table, args) -> str:
    """The table's own folder, ``WORK_ROOT/tables/<name>`` (``table9``,
    else ``<benchmark>_<scenario>_<model>``) with ``_<preset>`` for a
    preset's runs, ``_realtime-<cost>``, ``_seed<S>`` and ``_seeds<N>`` as
    asked (:func:`table_suffix`) and ``_only-<a>+<b>`` (the table's
    order) for a subset: the same runs always give the same folder, other
    runs another one."""
    name = short_name(table)
    if args.preset:
        name += f'_{args.preset}'
    name += table_suffix(args)
    chosen = [label(c) for c in table.configs if not args.only or
              label(c) in args.only]
    if len(chosen) < len(table.configs):  # all of them: the whole table
        name += '_only-' + '+'.join(chosen)
    return osp.join(osp.abspath(args.work_root), TABLES_DIR, name)


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
    #: the images of its stream where the config tells (for the ETA)
    images: Optional[int] = None
    batch_size: int = 1
    #: the batches an interrupted run has done (it resumes after them)
    batches_done: int = 0
    #: the fingerprint its run state on disk holds (None: none there)
    saved: Optional[dict] = field(default=None, repr=False)
    #: the config as tools/test.py will run it (options merged, prepared)
    cfg: object = field(default=None, repr=False)
    #: tools/test.py's --seed (None: the config's randomness.seed)
    seed: Optional[int] = None
    #: tools/test.py's --realtime: a step's cost, 'measure', None: offline
    realtime: object = None

    def command(self) -> List[str]:
        cmd = [sys.executable, TEST_PY, self.config, self.checkpoint,
               '--work-dir', self.work_dir]
        if self.seed is not None:
            cmd += ['--seed', str(self.seed)]
        if self.realtime is not None:
            cmd += ['--realtime', cost_text(self.realtime)]
        if self.state == 'interrupted':
            cmd.append('--resume')
        return cmd + (['--cfg-options'] + self.options if self.options
                      else [])

    @property
    def images_left(self) -> Optional[int]:
        if self.state == 'finished':
            return 0
        if self.images is None:
            return None
        return max(self.images - self.batches_done * self.batch_size, 0)


@dataclass
class OnDisk:
    """What a work dir holds: ``state`` (``new``, ``interrupted``: a run
    state short of the stream's end, ``finished``: complete results and a
    run state at the end or none), the fingerprint (``identity``) of its
    run state, and the batches that state says are done."""
    state: str
    identity: Optional[dict] = None
    batches_done: int = 0


def on_disk(work_dir: str) -> OnDisk:
    """Read ``work_dir`` as :class:`OnDisk` says.

    Raises:
        SystemExit: For results of another schema, or a run state that
            cannot be read (a rerun would overwrite what is there).
    """
    state_path = osp.join(work_dir, STATE_FILE)
    identity, done = None, 0
    if osp.isfile(state_path):
        from mmseg_stag.engine.run_state import load_run_state
        try:
            state = load_run_state(state_path, mmap=True)
        except RuntimeError as err:
            raise SystemExit(f'error: {state_path}: {err}; move the work '
                             'dir away to run it again') from None
        identity, done = state.get('identity'), state.get('batches_done', 0)
        if state.get('batches_done') != state.get('num_batches'):
            # a stale results file of an earlier run does not count
            return OnDisk('interrupted', identity, done)
    if not osp.isfile(osp.join(work_dir, RESULTS_FILE)):
        return OnDisk('new', identity)
    from mmseg_stag.engine.report import read_results
    try:
        read_results(work_dir)
    except ValueError as err:
        raise SystemExit(f'error: {err}') from None
    return OnDisk('finished', identity, done)


def run_state(work_dir: str) -> str:
    """``new``, ``interrupted`` or ``finished`` (:func:`on_disk`)."""
    return on_disk(work_dir).state


def parse_pairs(words: List[str], what: str) -> Dict[str, str]:
    pairs = OrderedDict()
    for word in words:
        key, sep, value = word.partition('=')
        if not sep or not key or not value:
            raise SystemExit(f'error: {what} {word!r} is not KEY=VALUE')
        pairs[key] = value
    return pairs


def cfg_options(options: List[str]) -> dict:
    """``--cfg-options`` as tools/test.py reads them (MMEngine's
    ``DictAction``: numbers, tuples, lists, booleans), so that the planned
    config is the one the run gets."""
    if not options:
        return {}
    from mmengine.config import DictAction
    parser = argparse.ArgumentParser()
    parser.add_argument('--cfg-options', nargs='+', action=DictAction)
    return parser.parse_args(['--cfg-options', *options]).cfg_options


def root_option(key: str, cfg, given: str, base: str = REPO) -> str:
    """``key=DIR`` for the folder ``given``: spelled as the config spells
    it where that is the same folder (tools/test.py runs from ``base``),
    else absolute. The fingerprint holds the spelling: a run made from
    the docs with the config's own data root (or the same
    ``--cfg-options``) is then this run, not another one."""
    from mmseg_stag.paper.tables import value_at
    own = value_at(cfg, key)
    if isinstance(own, str) and osp.realpath(
            osp.join(base, own)) == osp.realpath(given):
        return f'{key}={own}'
    return f'{key}={osp.abspath(given)}'


def preset_configs(configs: List[str], preset: str) -> Dict[str, str]:
    """Each config's sibling of ``preset``: the one of its suffixes that
    exists (``SystemExit`` naming each config with none or with two)."""
    chosen, wrong = {}, []
    for config in configs:
        stem = config[:-len('.py')]
        found = [stem + s + '.py' for s in PRESETS[preset]
                 if osp.isfile(stem + s + '.py')]
        if len(found) == 1:
            chosen[config] = found[0]
        else:
            names = ' or '.join(osp.basename(stem) + s + '.py'
                                for s in PRESETS[preset])
            wrong.append(f'{shown(config)}: ' + (
                f'no {preset} sibling ({names})' if not found else
                f'{len(found)} {preset} siblings ({names}): keep one'))
    if wrong:
        raise SystemExit(f'error: --preset {preset}: ' + '; '.join(wrong) +
                         ' (run these without --preset, or leave them out '
                         'with --only)')
    return chosen


def cuda_available() -> bool:
    import torch
    return torch.cuda.is_available()


def refuse_preset_without_cuda(args) -> None:
    """A preset is for a CUDA GPU: refused here, before any run, rather
    than failing in each run's log (with --launcher ray the runs may be on
    other machines: only a local Ray, no --address, is this machine)."""
    if not args.preset or args.dry_run or (
            args.launcher == 'ray' and args.address):
        return
    if not cuda_available():
        raise SystemExit(
            f'error: --preset {args.preset} runs on a CUDA GPU and this '
            'machine has none (torch.cuda.is_available() is False): run the '
            'table without --preset (the faithful configs)')


def planned_config(run: Run, cfg):
    """The config tools/test.py will run: ``cfg`` (``run.config`` read),
    ``--cfg-options`` merged, prepared
    (``mmseg_stag.engine.runs.prepare_config``)."""
    from mmseg_stag.engine.runs import prepare_config
    options = cfg_options(run.options)
    if options:
        cfg.merge_from_dict(options)
    return prepare_config(cfg, run.work_dir, run.config, seed=run.seed,
                          realtime=run.realtime)


def planned_images(cfg, table: Table) -> Optional[int]:
    """The images of a run's stream as its config says them, the paper's
    counts (``mmseg_stag.paper.tables.PROTOCOLS``) where it takes a whole
    set; None where it says neither."""
    from mmseg_stag.paper.tables import PROTOCOLS, value_at
    dataset = value_at(cfg, 'test_dataloader.dataset') or {}
    protocol = PROTOCOLS.get((table.benchmark, table.scenario))
    # the dataset by its registered type (a scope prefix allowed), not by
    # the keys it happens to have
    kind = str(dataset.get('type', '')).rsplit('.', 1)[-1]
    if kind == 'ACDCContinualDataset':
        per = dataset.get('images_per_condition') or (
            protocol or {}).get('images')
        return None if per is None else \
            len(dataset['conditions']) * int(per) * int(dataset['rounds'])
    corruptions = dataset.get('corruptions')
    n = (dataset.get('corruption_set') or {}).get('n_examples')
    if corruptions and n:
        return len(corruptions) * int(n)
    if protocol:  # the whole set of each corruption
        return protocol['images'] * len(protocol['conditions']) * \
            protocol['rounds']
    return None


def plan(table: Table, args) -> List[Run]:
    """The runs of ``table`` as ``args`` asks, each with its state; every
    file and choice checked, and each run on disk fingerprinted, before
    anything runs."""
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
    parse_pairs(args.cfg_options, '--cfg-options')
    siblings = preset_configs(configs, args.preset) if args.preset else {}
    refuse_preset_without_cuda(args)
    from mmengine.config import Config
    data_key = DATA_ROOT_KEYS.get(table.benchmark, CORRUPTION_ROOT_KEY)
    planned, reads_source = [], False
    for faithful in configs:
        config = siblings.get(faithful, faithful)
        own = Config.fromfile(config)  # as tools/test.py reads it
        options = [root_option(data_key, own, args.data_root)]
        if args.source_data_root and needs_source(own):
            reads_source = True
            # after the data root, before the user's: theirs win
            options.append(root_option(SOURCE_ROOT_KEY, own,
                                       args.source_data_root))
        options += list(args.cfg_options)
        planned.append((faithful, config, own, options,
                        run_seeds(own, args)))
    if args.source_data_root and not reads_source:
        raise SystemExit(f'error: --source-data-root: no run of '
                         f'{table.name} reads clean source images (only '
                         'EATA\'s configs do)')
    # seed after seed, each a whole table: the first seed's table is
    # complete while the next one's runs
    runs = [plan_run(table, args, faithful, config, own, options, seeds[k])
            for k in range(args.seeds)
            for faithful, config, own, options, seeds in planned]
    check_fingerprints(runs)
    return runs


def run_seeds(own, args) -> List[Optional[int]]:
    """The seeds of a config's runs: ``[None]`` (the config's own
    ``randomness.seed``, no ``--seed``) unless ``--seed`` or ``--seeds``
    ask; else ``--seeds`` of them from ``--seed``, or from the config's
    own seed (0 where it has none)."""
    if args.seed is None and args.seeds == 1:
        return [None]
    from mmseg_stag.paper.tables import value_at
    mine = value_at(own, SEED_KEY)
    first = args.seed if args.seed is not None else (
        mine if isinstance(mine, int) and not isinstance(mine, bool)
        else 0)
    if first + args.seeds - 1 > MAX_SEED:
        raise SystemExit(f'error: --seeds {args.seeds} from seed {first}: '
                         f'a seed above {MAX_SEED} (NumPy\'s largest)')
    return [first + k for k in range(args.seeds)]


def plan_run(table: Table, args, faithful: str, config: str, own,
             options: List[str], seed: Optional[int]) -> Run:
    """One run of ``config`` (``own``: it read) at ``seed`` (None: the
    config's own), in its work dir ``WORK_ROOT/<stem>[_realtime-<cost>]
    [_seed<k>]`` (no ``_seed`` for the config's own seed: the run it makes
    without --seed), what that work dir holds read."""
    from mmseg_stag.paper.tables import value_at
    name = label(faithful)
    method = name[:-len('-stag')] if name.endswith('-stag') else name
    stem = osp.splitext(osp.basename(config))[0]
    own_seed = value_at(own, SEED_KEY)
    work_dir = osp.join(osp.abspath(args.work_root), stem + run_suffix(
        args.realtime, None if seed == own_seed else seed))
    found = on_disk(work_dir)
    run = Run(name + (f' seed {seed}' if args.seeds > 1 else ''), config,
              faithful, osp.abspath(args.checkpoint_for.get(
                  method, args.checkpoint)),
              work_dir, options, found.state,
              batches_done=found.batches_done, saved=found.identity,
              seed=seed, realtime=args.realtime)
    run.cfg = planned_config(run, own.copy())
    check_realtime(run)
    run.images = planned_images(run.cfg, table)
    run.batch_size = int(value_at(run.cfg, 'test_dataloader.batch_size')
                         or 1)
    return run


def check_realtime(run: Run) -> None:
    """``--realtime`` checked on the run's config as the online loop
    checks it (``measure`` is refused with a CUDA graph: a fast preset's
    ``_bf16-graph`` config), before any run."""
    if run.realtime is None:
        return
    from mmseg_stag.engine.realtime import realtime_options
    from mmseg_stag.paper.tables import value_at
    try:
        realtime_options(dict(value_at(run.cfg, REALTIME_KEY)),
                         bool(value_at(run.cfg, 'test_cfg.cuda_graph')))
    except ValueError as err:
        raise SystemExit(f'error: --realtime {cost_text(run.realtime)}: '
                         f'{shown(run.config)}: {err}') from None


def needs_source(cfg) -> bool:
    """Whether a config reads clean source images (EATA's Fisher)."""
    return bool((cfg.get('test_cfg') or {}).get('source_dataloader'))


# -- the fingerprint -----------------------------------------------------
def planned_identity(run: Run, weights: Dict[str, str]) -> dict:
    """The fingerprint the online loop will give ``run`` (``run_identity``:
    its flattened config, the SHA-1 of its starting weights), without the
    run; ``weights`` caches the weights' digest per model and checkpoint
    (a model is built and loaded once, not per config)."""
    from mmseg_stag.engine.online_task import head_layer_of
    from mmseg_stag.engine.run_state import flatten_settings
    from mmseg_stag.engine.runs import starting_identity
    cfg = run.cfg
    key = json.dumps([cfg.get('model'), cfg.get('data_preprocessor'),
                      cfg.get('randomness'), cfg.get('default_scope'),
                      head_layer_of(cfg), osp.realpath(run.checkpoint)],
                     sort_keys=True, default=repr)
    if key not in weights:
        try:
            weights[key] = starting_identity(cfg, run.checkpoint)['weights']
        except Exception as err:  # the run itself would fail the same way
            raise SystemExit(
                f'error: {shown(run.checkpoint)} could not be loaded into '
                f'the model of {shown(run.config)} to compare it with the '
                f'run in {shown(run.work_dir)} ({type(err).__name__}: '
                f'{err})') from None
    return dict(config=flatten_settings(cfg.to_dict()), weights=weights[key])


def check_fingerprints(runs: List[Run]) -> None:
    """Stop before any run where a work dir holds a run (finished or not)
    whose fingerprint is not the planned run's: skipping it would table
    another run (a smoke run, another seed or option), resuming it would
    mix two. One message per such work dir, all at once.

    Raises:
        SystemExit: Naming each work dir, the settings that differ (on
            disk -> planned) and what to do.
    """
    from mmseg_stag.engine.run_state import (RESUME_IGNORES,
                                             identity_differences)
    problems, weights = [], {}
    for run in runs:
        where = shown(run.work_dir)
        move = (f'move it away (mv {where} {where}.old) or delete it to run '
                'it here, or give this command another --work-root')
        if run.saved is None:
            if run.state == 'finished':
                problems.append(
                    f'{where}: results ({RESULTS_FILE}) without a run state '
                    f'({STATE_FILE}, test_cfg.save_state=False?), so '
                    'nothing tells which config, options and weights made '
                    f'them. To go on: {move}.')
            continue
        diffs = identity_differences(run.saved, planned_identity(
            run, weights), RESUME_IGNORES)
        if diffs:
            what = {'finished': 'a finished run',
                    'interrupted': 'an interrupted run'}.get(
                        run.state, 'a run state')
            problems.append(
                f'{where} holds {what} other than {run.label} as this '
                f'command runs it: {len(diffs)} setting(s) differ (on disk '
                '-> this command):\n    ' + '\n    '.join(diffs) +
                f'\n  To go on: {move}; or give the options that run had.')
    if problems:
        raise SystemExit(
            f'error: {len(problems)} work dir(s) hold another run than the '
            'one this command would start there; nothing was started, '
            'nothing changed:\n' + '\n'.join(f'- {p}' for p in problems))


def describe(table: Table, runs: List[Run], args, out: str) -> str:
    seeded = args.seed is not None or args.seeds > 1
    lines = [f'{table.name} ({table.paper}): {len(runs)} run(s), each in '
             f'{shown(osp.abspath(args.work_root))}/<config stem>'
             f'{run_suffix(args.realtime)}{"[_seed<k>]" if seeded else ""}'
             f'; the table: {shown(out)}']
    if args.realtime == 'measure':
        lines.append('  protocol: realistic (--realtime measure, '
                     'docs/realtime.md): each run times its step on its '
                     'first batch; the batches that arrive during a step '
                     'are predicted only')
    elif args.realtime is not None:
        lines.append(f'  protocol: realistic (--realtime '
                     f'{cost_text(args.realtime)}, docs/realtime.md): a step '
                     f'costs {cost_text(args.realtime)} forwards; the batches '
                     'that arrive during it are predicted only')
    if args.seeds > 1:
        lines.append(f'  seeds: {args.seeds} of each config (_seed<k>: a '
                     'seed other than the config\'s own); the table: the '
                     'mean ± the sample standard deviation over them')
    for run in runs:
        how = {'new': 'runs', 'interrupted': 'resumes (--resume)',
               'finished': 'finished: skipped'}[run.state]
        if run.state == 'interrupted':
            how += f' after {run.batches_done * run.batch_size:,} images'
        preset = f', preset {args.preset}' if args.preset else ''
        seed = f', seed {run.seed}' if run.seed is not None and \
            args.seeds == 1 else ''
        size = f', {run.images:,} images' if run.images else ''
        lines.append(f'  {run.label}: {how}{preset}{seed}{size} '
                     f'({shown(run.work_dir)})')
    if args.preset and args.dry_run and not cuda_available():
        lines.append(f'  (--preset {args.preset} needs CUDA, which this '
                     'machine lacks: the real run would be refused)')
    return '\n'.join(lines)


# -- progress ------------------------------------------------------------
@dataclass
class Progress:
    """The last test iteration a run's log names: batches done of all,
    and the images/s the online loop's log processor gives (None where
    the line has none)."""
    batches: int
    num_batches: int
    images_per_s: Optional[float] = None


def read_progress(text: str) -> Optional[Progress]:
    """The last ``Iter(test) [i/N]`` line of ``text`` (MMEngine's test log
    line, every ``default_hooks.logger.interval`` batches; at the end once
    more with the metrics and no images/s: the last rate stays); None if
    none."""
    found, rate = None, None
    for line in text.splitlines():
        match = ITER_LINE.search(line)
        if match:
            given = IMAGES_PER_S.search(line, match.end())
            rate = float(given[1]) if given else rate
            found = Progress(int(match[1]), int(match[2]), rate)
    return found


class LogWatch:
    """A run's log read as it grows (from ``offset``: this run's part of
    an appended run.log)."""

    def __init__(self, path: str, offset: int = 0):
        self.path, self.offset, self.partial = path, offset, ''
        self.last: Optional[Progress] = None

    def poll(self) -> Optional[Progress]:
        try:
            with open(self.path, 'rb') as f:
                f.seek(self.offset)
                chunk = f.read()
        except OSError:
            return self.last
        self.offset += len(chunk)
        text = self.partial + chunk.decode('utf-8', errors='replace')
        # a line being written counts when whole
        text, _, self.partial = text.rpartition('\n')
        self.last = read_progress(text) or self.last
        return self.last


def duration(seconds: float) -> str:
    return str(timedelta(seconds=int(round(seconds))))


def progress_line(run: Run, progress: Optional[Progress],
                  rate: Optional[float], later: List[Optional[int]],
                  log_path: str, elapsed: float) -> str:
    """One console line of a running run: images done of all, images/s,
    the ETA of the run and of the table (the later runs' images at this
    run's rate), its log.

    Args:
        progress: What its log says last (None: no iteration logged yet).
        rate: Images/s (None: not known yet).
        later: The images left of each later run (None: unknown).
        elapsed: Seconds since it started.
    """
    head = f'[reproduce] {run.label}:'
    tail = f'log {shown(log_path)}'
    if progress is None:
        return (f'{head} starting ({duration(elapsed)}, no iteration '
                f'logged yet), {tail}')
    total = progress.num_batches * run.batch_size
    if run.images:  # the config's count is exact; batches may be partial
        total = min(total, run.images)
    done = min(progress.batches * run.batch_size, total)
    parts = [f'{done:,}/{total:,} images ({100 * done / max(total, 1):.1f}%)']
    if rate:
        eta = (total - done) / rate
        parts.append(f'{rate:.2f} images/s, ETA {duration(eta)}')
        known = [n for n in later if n is not None]
        if later:
            parts[-1] += (f' (table {duration(eta + sum(known) / rate)}' +
                          (', runs of unknown size not counted'
                           if len(known) < len(later) else '') + ')')
    return f'{head} {", ".join(parts)}, {tail}'


# -- running -------------------------------------------------------------
def run_local(runs: List[Run], args) -> None:
    """Each run in its own ``tools/test.py`` process (a crash or a kill
    ends that run only), its output appended to ``WORK_DIR/run.log`` as
    tools/sweep.py does; its progress on the console every
    ``args.progress_every`` seconds."""
    todo = [r for r in runs if r.state != 'finished']
    for index, run in enumerate(todo):
        cmd = run.command()
        print(f'[reproduce] {run.label} (run {index + 1} of {len(todo)}): '
              f'{shlex.join(cmd)}', flush=True)
        if args.dry_run:
            continue
        os.makedirs(run.work_dir, exist_ok=True)
        log_path = osp.join(run.work_dir, 'run.log')
        later = todo[index + 1:]
        with open(log_path, 'a') as log:
            log.write(shlex.join(cmd) + '\n')
            log.flush()
            returncode, seconds = follow(run, cmd, log, log_path, later,
                                         args.progress_every)
        how = 'finished' if returncode == 0 else (
            f'killed by signal {-returncode}' if returncode < 0
            else f'exit code {returncode}')
        print(f'[reproduce] {run.label}: {how} after {duration(seconds)} '
              f'(log: {shown(log_path)})', flush=True)


def follow(run: Run, cmd: List[str], log, log_path: str,
           later: List[Run], every: float) -> Tuple[int, float]:
    """Run ``cmd`` into ``log``, printing its progress every ``every``
    seconds; return its exit code and wall time. The rate is this run's
    average since its first logged iteration (a resumed run's included),
    the loop's own images/s until there are two. A stream shorter than
    its config says (fewer images on disk than the paper's) corrects the
    later runs of the same count too."""
    watch = LogWatch(log_path, log.tell())
    started = time.monotonic()
    # (when, images) of the first logged iteration seen, and of the latest
    # change: the rate between them (not up to now: the log is written
    # every logger interval, not continuously)
    first: Optional[Tuple[float, int]] = None
    latest: Optional[Tuple[float, int]] = None
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                            cwd=REPO)
    try:
        while True:
            try:
                proc.wait(timeout=every)
                break
            except subprocess.TimeoutExpired:
                pass
            now, progress = time.monotonic(), watch.poll()
            rate = None
            if progress is not None:
                images = progress.batches * run.batch_size
                total = progress.num_batches * run.batch_size
                planned = run.images
                if planned and total < planned:
                    for other in [run] + later:
                        if other.images == planned:
                            other.images = total
                if first is None:
                    first = latest = (now, images)
                elif images > latest[1]:
                    latest = (now, images)
                if latest[1] > first[1]:
                    rate = (latest[1] - first[1]) / (latest[0] - first[0])
                rate = rate or progress.images_per_s
            print(progress_line(run, progress, rate,
                                [r.images_left for r in later], log_path,
                                now - started), flush=True)
    except BaseException:  # Ctrl-C: the run ends with this command
        proc.kill()
        proc.wait()
        raise
    return proc.returncode, time.monotonic() - started


def load_sweep():
    spec = importlib.util.spec_from_file_location('_reproduce_sweep',
                                                  SWEEP_PY)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_ray(runs: List[Run], args, out: str) -> None:
    """The runs not finished, as trials of tools/sweep.py's Ray runner
    (its resources, environment and gathered table), each in its work dir
    (``WORK_ROOT/<config stem>[_realtime-<cost>][_seed<k>]``, its seed the
    trial's, its protocol the setting ``--realtime`` makes), the sweep's
    files (``sweep_results.*``,
    ``ray/``) in the table's folder ``out``."""
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
    argv = ['--work-dir', out, '--resume', '--cfg-options',
            *[o for o in shared if not o.startswith(SOURCE_ROOT_KEY)]]
    for flag in ('address', 'num_cpus', 'gpus_per_run', 'cpus_per_run',
                 'max_concurrent'):
        value = getattr(args, flag)
        if value is not None:
            argv += ['--' + flag.replace('_', '-'), str(value)]
    sweep_args = sweep.parse_args(argv)
    sweep.check_address(sweep_args.address)
    # the seed as the sweep's own; the protocol as the setting
    # tools/test.py --realtime makes (the same fingerprint)
    trials = [dict(name=osp.basename(r.work_dir), config=r.config,
                   checkpoint=r.checkpoint, seed=r.seed, overrides={},
                   options=[o for o in r.options
                            if o.startswith(SOURCE_ROOT_KEY)] + ([
                                f'{REALTIME_KEY}.cost=' + (
                                    r.realtime if r.realtime == 'measure'
                                    else repr(float(r.realtime)))]
                                if r.realtime is not None else []),
                   work_dir=r.work_dir) for r in todo]
    sweep.check_runs(trials, sweep_args)
    sweep.run_on_ray(trials, sweep_args)


# -- the table -----------------------------------------------------------
def collect_command(runs: List[Run], args, out: str) -> List[str]:
    cmd = [sys.executable, COLLECT_PY] + [r.work_dir for r in runs] + [
        '--out', out]
    return cmd + (['--allow-short'] if args.allow_short else [])


def collect(runs: List[Run], args, out: str) -> bool:
    """The table of the finished runs in ``out`` (:func:`table_dir`);
    False if collect_results.py failed (it marks a preset's rows)."""
    cmd = collect_command(runs, args, out)
    print(f'[reproduce] {shlex.join(cmd)}', flush=True)
    if args.dry_run:
        return True
    done = subprocess.run(cmd, cwd=REPO)
    if done.returncode != 0:
        print(f'[reproduce] collect_results.py failed (exit code '
              f'{done.returncode})', flush=True)
        return False
    # collect_results.py names a realistic table's files so
    stem = 'paper_table' + ('_realtime' if args.realtime is not None
                            else '')
    print(f'[reproduce] the table: {shown(out)}/{stem}.md (.csv, .json,'
          ' .png)', flush=True)
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
    add('--work-root', default=DEFAULT_WORK_ROOT, help='WORK_ROOT/<config '
        'stem>[_realtime-<COST>][_seed<k>] per run (tools/test.py\'s '
        'default without --work-dir), WORK_ROOT/'
        f'{TABLES_DIR}/<table>[_<preset>][_realtime-<COST>][_seed<S>]'
        '[_seeds<N>][_only-<a>+<b>] for the table (default: '
        f'{DEFAULT_WORK_ROOT})')
    add('--only', nargs='+', metavar='NAME', help='only these configs of '
        'the table, by the method their file names end with (source, '
        'tent-stag, ...)')
    add('--preset', choices=sorted(PRESETS), help='run each config\'s '
        'fast sibling (<stem>_bf16-graph.py or <stem>_bf16.py) on one CUDA '
        'GPU; refused without CUDA')
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
    add('--realtime', metavar='COST', type=realtime_cost, help='the '
        'realistic online protocol (docs/realtime.md), tools/test.py '
        '--realtime for every run: a step costs COST forwards (measure: '
        'timed on the first batch); each run in WORK_ROOT/<config stem>_'
        'realtime-<COST>, the table apart (paper_table_realtime.md)')
    add('--seed', type=int, metavar='S', help='the first seed (tools/'
        'test.py --seed; default: the config\'s own randomness.seed)')
    add('--seeds', type=int, default=1, metavar='N', help='run each config '
        'at N seeds, S..S+N-1, each but the config\'s own seed in '
        'WORK_ROOT/<config stem>..._seed<k>; the table shows each cell\'s '
        'mean ± sample standard deviation (default: 1, no ±)')
    add('--dry-run', action='store_true', help='print the commands, run '
        'nothing')
    add('--progress-every', type=float, default=60, metavar='SECONDS',
        help='--launcher local: a progress line of the running run this '
        'often (default: 60)')
    ray = parser.add_argument_group('--launcher ray (tools/sweep.py)')
    ray.add_argument('--address', help='a running Ray cluster')
    ray.add_argument('--num-cpus', type=int, help='CPUs of a local Ray')
    ray.add_argument('--gpus-per-run', type=float)
    ray.add_argument('--cpus-per-run', type=float)
    ray.add_argument('--max-concurrent', type=int)
    args = parser.parse_args(argv)
    if not args.list:
        missing = [f'--{k.replace("_", "-")}' for k in
                   ('checkpoint', 'data_root') if getattr(args, k) is None]
        if args.table is None or missing:
            parser.error('give TABLE ' + ' '.join(f'{m} ...' for m in
                         missing) + ' (or --list)')
    if args.progress_every <= 0:
        parser.error('--progress-every: a number of seconds above 0')
    check_seeds(parser, args)
    args.checkpoint_for = parse_pairs(args.checkpoint_for,
                                      '--checkpoint-for')
    if args.launcher == 'local':
        given = [f'--{k.replace("_", "-")}' for k in (
            'address', 'num_cpus', 'gpus_per_run', 'cpus_per_run',
            'max_concurrent') if getattr(args, k) is not None]
        if given:
            parser.error(f'{", ".join(given)}: only with --launcher ray')
    return args


def check_seeds(parser, args) -> None:
    """``--seed``, ``--seeds`` and ``--realtime`` are the only way to
    their settings (a ``--cfg-options`` of them would not give the runs
    work dirs and a table of their own)."""
    if args.seeds < 1:
        parser.error(f'--seeds {args.seeds}: a number of seeds, 1 or more')
    if args.seed is not None and not 0 <= args.seed <= MAX_SEED:
        parser.error(f'--seed {args.seed}: a seed from 0 to {MAX_SEED}')
    keys = parse_pairs(args.cfg_options, '--cfg-options')
    if any(k == REALTIME_KEY or k.startswith(REALTIME_KEY + '.')
           for k in keys):
        parser.error(f'--cfg-options {REALTIME_KEY}...: give --realtime '
                     'COST (its runs get work dirs and a table of their '
                     'own)')
    if (args.seed is not None or args.seeds > 1) and (
            SEED_KEY in keys or 'randomness' in keys):
        parser.error(f'--cfg-options {SEED_KEY} with --seed/--seeds: give '
                     'the seed once')


def list_suffix(args) -> str:
    """``--list`` with ``--realtime``, ``--seed`` or ``--seeds``: where
    such runs and their table go."""
    if args.realtime is None and args.seed is None and args.seeds == 1:
        return ''
    seeded = '[_seed<k>]' if args.seed is not None or args.seeds > 1 else ''
    return (f'with these options each run goes to WORK_ROOT/<config stem>'
            f'{run_suffix(args.realtime)}{seeded} (_seed<k>: a seed other '
            f'than the config\'s own), the table to WORK_ROOT/{TABLES_DIR}/'
            f'<table>[_<preset>]{table_suffix(args)}[_only-<a>+<b>]\n')


def main(argv=None) -> int:
    args = parse_args(argv)
    tables = find_tables()
    if args.list:
        print(list_suffix(args) + list_tables(tables))
        return 0
    table = choose_table(args.table, tables)
    runs = plan(table, args)
    out = table_dir(table, args)
    print(describe(table, runs, args, out), flush=True)
    if args.launcher == 'ray':
        run_ray(runs, args, out)
    else:
        run_local(runs, args)
    if args.dry_run:
        collect(runs, args, out)
        return 0
    states = {r.label: run_state(r.work_dir) for r in runs}
    failed = [name for name, state in states.items() if state != 'finished']
    if failed:
        print(f'[reproduce] not finished: {", ".join(failed)} (their '
              'run.log); run the same command again to resume them; no '
              'table', flush=True)
        return 1
    print(f'[reproduce] all {len(runs)} runs finished', flush=True)
    return 0 if collect(runs, args, out) else 1


if __name__ == '__main__':
    sys.exit(main())
