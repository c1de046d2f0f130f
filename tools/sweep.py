"""Many online runs in parallel on Ray, either task: configs x checkpoints x
seeds x a grid of ``--cfg-options`` values (e.g. STAG's beta0/gamma), one
GPU per run when the cluster has GPUs, CPU workers otherwise.

    python tools/sweep.py --work-dir W
        (--run CONFIG CHECKPOINT ... | --configs C ... --checkpoints K ...)
        [--grid KEY=V1,V2,... ...] [--seeds 0 1 ...] [--cfg-options k=v ...]
        [--scheduler fifo|asha] [--grace-stages N] [--max-stages N]
        [--address HOST:PORT] [--num-cpus N] [--gpus-per-run G]
        [--cpus-per-run C] [--max-concurrent N] [--resume]

Every run is one ``tools/test.py`` process (its work dir ``W/runs/<name>``
with its ``run.log``) in a Ray Tune trial that reports each stage's score
(mIoU or accuracy) as the stage ends; ``--scheduler asha`` stops runs that
trail the others at the same stage. When all have ended,
``W/sweep_results.{csv,json,md,png}`` gather them, each with its status.
The files, the grid keys and the Ray address are checked before Ray
starts. docs/sweeps.md says more; Ray is the ``.[sweep]`` extra.
"""
import argparse
import ast
import functools
import inspect
import itertools
import os
import os.path as osp
import re
import signal
import socket
import subprocess
import sys
import time

REPO = osp.dirname(osp.dirname(osp.abspath(__file__)))
TEST_PY = osp.join(REPO, 'tools', 'test.py')
#: the setting that says how many data-loading processes a run starts
WORKERS_KEY = 'test_dataloader.num_workers'
RAY_HINT = ('tools/sweep.py runs on Ray, which is not installed: '
            "pip install -e '.[sweep]'  (or: pip install 'ray[tune]')")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description='continual runs in parallel on Ray (Tune)')
    parser.add_argument('--work-dir', required=True,
                        help='the sweep folder: runs/<name>/ per run, the '
                        'gathered table and figure')
    parser.add_argument('--run', nargs=2, action='append', default=[],
                        metavar=('CONFIG', 'CHECKPOINT'),
                        help='one config with its checkpoint (repeatable)')
    parser.add_argument('--configs', nargs='+', default=[],
                        help='configs, each run with every --checkpoints')
    parser.add_argument('--checkpoints', nargs='+', default=[])
    parser.add_argument('--grid', nargs='+', default=[],
                        metavar='KEY=V1,V2',
                        help='config keys and their values; every '
                        'combination is a run, e.g. '
                        'test_cfg.method.stag.beta0=100,500,1000')
    parser.add_argument('--seeds', nargs='+', type=int, default=[0])
    parser.add_argument('--cfg-options', nargs='+', default=[],
                        metavar='KEY=VALUE',
                        help='settings of every run (tools/test.py '
                        '--cfg-options)')
    parser.add_argument('--scheduler', choices=['fifo', 'asha'],
                        default='fifo',
                        help='fifo: every run to the end; asha: stop runs '
                        'whose stage score trails (Ray Tune ASHAScheduler)')
    parser.add_argument('--grace-stages', type=int, default=4,
                        help='asha: stages every run completes first')
    parser.add_argument('--max-stages', type=int, default=40,
                        help='asha: stages of a whole run (the paper: 40)')
    parser.add_argument('--address',
                        help='a running Ray cluster (HOST:PORT, '
                        'ray://HOST:PORT or auto); default: start a local '
                        'instance')
    parser.add_argument('--num-cpus', type=int,
                        help='CPUs of the local instance (default: all)')
    parser.add_argument('--gpus-per-run', type=float, default=1,
                        help='GPUs per run when the cluster has GPUs')
    parser.add_argument('--cpus-per-run', type=float,
                        help='CPUs per run (default: 1 + the config\'s '
                        'test_dataloader.num_workers, the main process and '
                        'its data workers, at most a node\'s CPUs); also '
                        'the run\'s OMP_NUM_THREADS')
    parser.add_argument('--max-concurrent', type=int, default=0,
                        help='runs at once (0: as many as resources allow)')
    parser.add_argument('--resume', action='store_true',
                        help='continue each run from its last finished '
                        'stage (tools/test.py --resume) where it has one')
    return parser.parse_args(argv)


# -- the runs ------------------------------------------------------------
def parse_value(text: str):
    """A grid or option value: a Python literal, else the string."""
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def parse_pairs(words, what):
    pairs = []
    for word in words:
        key, sep, value = word.partition('=')
        if not sep or not key:
            raise SystemExit(f'error: {what} {word!r} is not KEY=VALUE')
        pairs.append((key, value))
    return pairs


def parse_grid(words):
    """``['k=1,2', ...]`` -> ``{'k': [1, 2], ...}``."""
    return {key: [parse_value(v) for v in split_values(values)]
            for key, values in parse_pairs(words, '--grid')}


def split_values(text):
    """Split on commas outside brackets: ``'1,(2,3)'`` -> ``'1'``,
    ``'(2,3)'``."""
    parts, depth, current = [], 0, ''
    for ch in text:
        depth += ch in '([{'
        depth -= ch in ')]}'
        if ch == ',' and depth == 0:
            parts.append(current)
            current = ''
        else:
            current += ch
    return parts + [current]


def stem(path):
    return osp.splitext(osp.basename(path))[0]


def expand_runs(args):
    """Every run: ``dict(name, config, checkpoint, seed, overrides,
    work_dir)``."""
    pairs = [tuple(p) for p in args.run] + list(
        itertools.product(args.configs, args.checkpoints))
    if not pairs:
        raise SystemExit('error: no run: give --run CONFIG CHECKPOINT or '
                         '--configs ... --checkpoints ...')
    if bool(args.configs) != bool(args.checkpoints):
        raise SystemExit('error: --configs and --checkpoints go together')
    grid = parse_grid(args.grid)
    labels = {k: k.rsplit('.', 1)[-1] for k in grid}
    if len(set(labels.values())) < len(labels):
        labels = {k: k for k in grid}
    runs = []
    for (config, checkpoint), values, seed in itertools.product(
            pairs, itertools.product(*grid.values()) if grid else [()],
            args.seeds):
        overrides = dict(zip(grid, values))
        name = ','.join([f'{stem(config)}@{stem(checkpoint)}'] + [
            f'{labels[k]}={v}' for k, v in overrides.items()] +
            [f'seed={seed}'])
        name = re.sub(r'[^A-Za-z0-9_.,=@+-]', '_', name)
        runs.append(dict(name=name, config=osp.abspath(config),
                         checkpoint=osp.abspath(checkpoint), seed=seed,
                         overrides=overrides,
                         work_dir=osp.join(osp.abspath(args.work_dir),
                                           'runs', name)))
    names = [r['name'] for r in runs]
    if len(set(names)) < len(names):
        raise SystemExit('error: two runs would share a name (the same '
                         'config and checkpoint file names twice?)')
    return runs


# -- checks before Ray starts -------------------------------------------
def component_arguments(type_name):
    """The ``__init__`` arguments of a registered component (an online
    method, or an entry of MMEngine's registries in the plugin's or MMSeg's
    scope), over its base classes."""
    import importlib.util

    from mmengine import registry as mmengine_registry

    import mmseg_stag  # noqa: F401  (registers everything)
    from mmseg_stag.core import METHODS
    if not isinstance(type_name, str):
        return set()
    scopes = ['mmseg_stag'] + (['mmseg'] if importlib.util.find_spec('mmseg')
                               else [])
    names = [type_name] + [f'{scope}.{type_name}' for scope in scopes]
    registries = [METHODS] + [getattr(mmengine_registry, r) for r in (
        'MODELS', 'DATASETS', 'TRANSFORMS', 'LOOPS', 'METRICS', 'HOOKS',
        'DATA_SAMPLERS')]
    for registry in registries:
        for name in names if registry is not METHODS else names[:1]:
            try:
                cls = registry.get(name)
            except (KeyError, ImportError):
                continue
            if cls is not None:
                inits = [k.__init__ for k in inspect.getmro(cls)
                         if '__init__' in vars(k)]
                params = {p for init in inits
                          for p in inspect.signature(init).parameters}
                return params - {'self', 'args', 'kwargs'}
    return set()


def check_key(cfg, key):
    """Why ``key`` is not a setting of ``cfg`` (``None`` if it is)."""
    node, parts = cfg, key.split('.')
    for i, part in enumerate(parts):
        last = i == len(parts) - 1
        if isinstance(node, (list, tuple)) and part.isdigit() and \
                int(part) < len(node):
            node = node[int(part)]
            continue
        if isinstance(node, dict) and part in node:
            node = node[part]
            continue
        where = '.'.join(parts[:i]) or '<top level>'
        if last and isinstance(node, dict) and \
                part in component_arguments(node.get('type')):
            return None  # an argument the component takes, at its default
        keys = sorted(node) if isinstance(node, dict) else []
        return (f'{where} has no {part!r}' +
                (f' (its keys: {", ".join(map(str, keys))})' if keys else ''))
    return None


def check_runs(runs, args):
    """Every file exists and every grid key is a setting of every config."""
    from mmengine.config import Config
    for path in sorted({r['config'] for r in runs} |
                       {r['checkpoint'] for r in runs}):
        if not osp.isfile(path):
            raise SystemExit(f'error: file not found: {path}')
    parse_pairs(args.cfg_options, '--cfg-options')
    for config in sorted({r['config'] for r in runs}):
        cfg = Config.fromfile(config)
        if cfg.get('test_cfg', {}).get('type') != 'OnlineAdaptationLoop':
            raise SystemExit(f'error: {config} is not an online-adaptation '
                             'config (test_cfg.type=OnlineAdaptationLoop)')
        for key in runs[0]['overrides']:  # every run has the grid's keys
            why = check_key(cfg.to_dict(), key)
            if why:
                raise SystemExit(f'error: --grid key {key!r} is not a setting'
                                 f' of {config}: {why}')


def check_address(address, timeout=5.0):
    """A ``HOST:PORT`` (or ``ray://HOST:PORT``) address must answer."""
    if address in (None, 'auto', 'local'):
        return
    hostport = address.split('://', 1)[-1]
    host, _, port = hostport.rpartition(':')
    if not host or not port.isdigit():
        raise SystemExit(f'error: --address {address!r} is not HOST:PORT, '
                         'ray://HOST:PORT or auto')
    try:
        socket.create_connection((host, int(port)), timeout=timeout).close()
    except OSError as err:
        raise SystemExit(
            f'error: the Ray cluster at --address {address} does not answer '
            f'({err}); start it first (ray start --head, see docs/sweeps.md) '
            'or leave --address out for a local instance') from err


# -- what each run asks Ray for ------------------------------------------
@functools.lru_cache(maxsize=None)
def config_workers(config):
    """``test_dataloader.num_workers`` of a config file (0 if unset)."""
    from mmengine.config import Config
    loader = Config.fromfile(config).get('test_dataloader') or {}
    return int(loader.get('num_workers', 0) or 0)


def run_cpus(run, args):
    """The CPUs a run asks for before any cap: ``--cpus-per-run``, else 1
    (the main process) + its data workers (its grid value, else
    ``--cfg-options``', else its config's)."""
    if args.cpus_per_run is not None:
        return args.cpus_per_run
    options = {k: parse_value(v) for k, v in
               parse_pairs(args.cfg_options, '--cfg-options')}
    settings = dict(options, **run['overrides'])
    workers = settings.get(WORKERS_KEY, None)
    if workers is None:
        workers = config_workers(run['config'])
    return 1 + int(workers)


def plan_resources(runs, args, cluster_gpus, node_cpus):
    """Set each run's ``cpus`` and ``gpus`` (what its trial holds) on a
    cluster of ``cluster_gpus`` whose largest node has ``node_cpus``."""
    # Ray would wait forever for more CPUs than a node has
    if args.cpus_per_run is not None and args.cpus_per_run > node_cpus:
        raise SystemExit(f'error: --cpus-per-run {args.cpus_per_run:g} '
                         f'exceeds the CPUs of every Ray node (at most '
                         f'{node_cpus:g}): no run could start')
    for run in runs:
        # a default larger than a node is cut to it, so that runs start
        run['cpus'] = min(run_cpus(run, args), node_cpus)
        run['gpus'] = args.gpus_per_run if cluster_gpus else 0


def trial_resources(config):
    """The Ray Tune request of a trial: its run's CPUs (and GPUs)."""
    from ray import tune
    run = config['run']
    bundle = dict(CPU=run['cpus'])
    if run['gpus']:
        bundle['GPU'] = run['gpus']
    return tune.PlacementGroupFactory([bundle])


def child_env(environ, cpus, launcher_variables):
    """The Ray worker's ``environ`` for a run of ``cpus`` CPUs: its
    ``OMP_NUM_THREADS`` those CPUs, no launcher's process counts (the
    run is one process; the node's ``srun`` step or MPI job is not its):
    ``launcher_variables``, the names the launch guard reads (given by the
    driver: see :func:`run_trial`)."""
    env = {k: v for k, v in environ.items() if k not in launcher_variables}
    # Ray sets it only where unset: a shell's 1 would leave torch 1 thread
    env['OMP_NUM_THREADS'] = str(max(1, int(cpus)))
    return env


def partial_reader():
    """``mmseg_stag.engine.report.read_partial``, loaded by its file path.

    A trial only polls its run's text file; importing the module by name
    would first import the package, i.e. torch, MMEngine and MMSeg (3.4 s
    on a 2-core CPU machine, 17 s on a GPU machine with transformers
    installed) into every trial's Ray worker. ``report.py`` imports only
    the standard library and numpy at the top (the sweep's tests load it
    so)."""
    import importlib.util
    path = osp.join(REPO, 'mmseg_stag', 'engine', 'report.py')
    spec = importlib.util.spec_from_file_location('_sweep_report', path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.read_partial


# -- one run (inside a Ray worker) --------------------------------------
def die_with_parent():
    """The run dies with the Ray worker that started it (Linux)."""
    import ctypes
    try:
        ctypes.CDLL('libc.so.6', use_errno=True).prctl(1, signal.SIGKILL)
    except OSError:  # not Linux: the worker's finally still kills it
        pass


def run_trial(config):
    """Ray Tune trial: one ``tools/test.py`` run, each finished stage
    reported (its score, mIoU or accuracy, and the mean so far). It
    imports nothing of the package: what it needs of it comes in
    ``config`` (the launchers' variables) or by path
    (:func:`partial_reader`)."""
    from ray import tune

    read_partial = partial_reader()
    run, options, resume = config['run'], config['options'], config['resume']
    os.makedirs(run['work_dir'], exist_ok=True)
    cmd = [sys.executable, TEST_PY, run['config'], run['checkpoint'],
           '--work-dir', run['work_dir']]
    # None: the config's own randomness.seed (tools/reproduce.py's runs)
    if run['seed'] is not None:
        cmd += ['--seed', str(run['seed'])]
    if resume and osp.isfile(osp.join(run['work_dir'],
                                      'online_adaptation_state.pth')):
        cmd.append('--resume')
    # a run's own settings (tools/reproduce.py: EATA's clean images) after
    # the sweep's, the grid's last
    words = options + list(run.get('options', ())) + [
        f'{k}={v}' for k, v in run['overrides'].items()]
    if words:
        cmd += ['--cfg-options'] + words
    log_path = osp.join(run['work_dir'], 'run.log')
    with open(log_path, 'a') as log:
        log.write(' '.join(cmd) + '\n')
        log.flush()
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                cwd=REPO, preexec_fn=die_with_parent,
                                env=child_env(os.environ, run['cpus'],
                                              config['launcher_variables']))
    with open(osp.join(run['work_dir'], 'pid'), 'w') as f:
        f.write(str(proc.pid))
    reported, values = 0, []
    try:
        while True:
            finished = proc.poll() is not None
            for stage in read_partial(run['work_dir'])[reported:]:
                reported += 1
                key = stage['score_name']  # mIoU or acc
                values.append(stage['score'])
                tune.report({key: stage['score'], 'score': stage['score'],
                             'stage': reported, 'round': stage['round'],
                             'condition': stage['condition'],
                             f'{key}_mean_over_stages':
                             sum(values) / len(values)})
            if finished:
                break
            time.sleep(0.5)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    if proc.returncode != 0:
        how = (f'killed by signal {-proc.returncode}' if proc.returncode < 0
               else f'exit code {proc.returncode}')
        raise RuntimeError(f'{run["name"]}: tools/test.py {how} after '
                           f'{reported} stage(s); log: {log_path}')


# -- the sweep ------------------------------------------------------------
def gather(runs, results, work_dir):
    """The table and figure of every run, with its status."""
    from mmseg_stag.engine.comparison import read_run_stages, write_comparison
    errors = {}
    for result in results:
        name = result.config['run']['name']
        if result.error is not None:
            first = str(result.error).strip().splitlines()
            errors[name] = next((line for line in reversed(first)
                                 if 'tools/test.py' in line),
                                first[-1] if first else 'error')
    rows = []
    for run in runs:
        stages, finished = read_run_stages(run['work_dir'])
        if run['name'] in errors:
            status = 'failed: ' + errors[run['name']].split(': ', 1)[-1]
        elif finished:
            status = 'finished'
        else:
            status = f'stopped early after {len(stages)} stage(s)'
        rows.append(dict(name=run['name'], status=status,
                         config=osp.relpath(run['config'], REPO),
                         checkpoint=run['checkpoint'], seed=run['seed'],
                         **{k: v for k, v in run['overrides'].items()},
                         stages=stages))
    return write_comparison(work_dir, rows, prefix='sweep_results',
                            title='sweep: score per condition')


def main(argv=None):
    args = parse_args(argv)
    runs = expand_runs(args)
    check_runs(runs, args)
    check_address(args.address)
    paths = run_on_ray(runs, args)
    with open(paths['md']) as f:
        print(f.read(), flush=True)
    print(f'[sweep] results: {paths["csv"]}, {paths["json"]}, '
          f'{paths["md"]}, {paths["png"]}', flush=True)


def run_on_ray(runs, args):
    """Run ``runs`` (:func:`expand_runs`' dicts, checked) as Ray Tune
    trials as ``args`` (:func:`parse_args`' namespace) says, then gather
    them into ``args.work_dir/sweep_results.*``; return :func:`gather`'s
    paths. ``tools/reproduce.py`` runs a paper table's configs through
    it."""
    from mmseg_stag.engine.launch_guard import LAUNCHER_VARIABLES
    try:
        import ray
        from ray import tune
        from ray.tune.schedulers import ASHAScheduler, FIFOScheduler
    except ImportError:
        raise SystemExit('error: ' + RAY_HINT)
    work_dir = osp.abspath(args.work_dir)
    os.makedirs(work_dir, exist_ok=True)
    if args.address:
        ray.init(address=args.address)
    else:
        ray.init(num_cpus=args.num_cpus, include_dashboard=False,
                 object_store_memory=256 * 1024 * 1024)
    node_cpus = max(node['Resources'].get('CPU', 0) for node in ray.nodes()
                    if node['Alive'])
    plan_resources(runs, args, ray.cluster_resources().get('GPU', 0),
                   node_cpus)
    asks = sorted({(r['cpus'], r['gpus']) for r in runs})
    print(f'[sweep] {len(runs)} runs on Ray ({ray.cluster_resources()}); '
          'each run: ' + ' or '.join(f'{c:g} CPU(s), {g:g} GPU(s)'
                                     for c, g in asks), flush=True)
    scheduler = FIFOScheduler() if args.scheduler == 'fifo' else \
        ASHAScheduler(time_attr='training_iteration', max_t=args.max_stages,
                      grace_period=args.grace_stages)
    tuner = tune.Tuner(
        tune.with_resources(run_trial, trial_resources),
        param_space=dict(run=tune.grid_search(runs),
                         options=args.cfg_options, resume=args.resume,
                         launcher_variables=list(LAUNCHER_VARIABLES)),
        tune_config=tune.TuneConfig(
            metric='score', mode='max', scheduler=scheduler,
            max_concurrent_trials=args.max_concurrent or None,
            trial_dirname_creator=lambda trial: trial.config['run']['name']),
        run_config=tune.RunConfig(
            name='sweep', storage_path=osp.join(work_dir, 'ray'),
            failure_config=tune.FailureConfig(max_failures=0), verbose=1))
    results = tuner.fit()
    paths = gather(runs, results, work_dir)
    ray.shutdown()
    return paths


if __name__ == '__main__':
    main()
