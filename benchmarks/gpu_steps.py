"""The GPU check's measuring steps (``tools/gpu_check.py``): the CUDA
tests, the step cost, the loader, the whole loop and the profile, each a
function of the tool's context ``ctx`` returning the step's result."""
import argparse
import contextlib
import copy
import gc
import importlib.util
import math
import os
import os.path as osp
import re
import statistics
import subprocess
import sys
import time
import traceback

#: step_cost's SegFormer baselines (step_benchmark.BASELINES), each against
#: its +STAG arm; the ResNet-50 runs tent_graph too when it is named
SEG_METHODS = ('tent', 'tent_graph', 'cotta', 'cotta_fast', 'cotta_graph',
               'hybrid_tta')
#: the rows replayed as CUDA graphs (a CUDA device only)
GRAPH_METHODS = ('tent_graph', 'cotta_graph')

#: Hybrid-TTA masks 32-px patches: its input's sides are multiples of 32
MASK_PATCH = 32
PRECISIONS = ('fp32', 'tf32', 'bf16')

#: the paper's segmentation config (NVlabs head, D = 768) and its pattern
NVLABS_CFG = ('configs/stag_acdc/'
              'segformer_mit-b5-nvlabs_acdc-continual_{}.py')

#: the generated stream's ACDC conditions, in the stream's order
CONDITIONS = ('fog', 'night', 'rain', 'snow')

#: the loop step's runs without --loop-methods (and on CUDA
#: ``LOOP_CUDA_DEFAULT`` after them)
LOOP_DEFAULT = ('tent', 'tent-stag')
LOOP_CUDA_DEFAULT = ('tent-stag_bf16-graph', )

#: a fast preset's config name: its faithful config's and a suffix
#: (``_bf16-graph``: the step replayed as a CUDA graph; ``_bf16``: eager)
PRESET_NAME = re.compile(r'(?P<faithful>.+)_bf16(?:-graph)?')

#: shares of the budget: the tests' time limit (35 % left one test of 66
#: running on an H100) and what loader, loop and profile take on one H100
#: (75-127 s measured)
TESTS_SHARE, FIXED_STEPS_S = 0.4, 130.0

#: what a step-cost row takes besides its timed pairs (the model, each
#: arm's memory; 7-14 s measured on an H100 when the STAG term was also
#: timed alone), and what the timed pairs get of the rest
ROW_OVERHEAD_S, PAIRS_SHARE = 15.0, 0.8

#: the SegFormer rows' MiT: (attention, token_maps) of
#: segmentation/models/fast_mit.py, by name
MIT_MODES = {'mmseg': ('mmseg', 'copy'), 'sdpa': ('sdpa', 'copy'),
             'sdpa-views': ('sdpa', 'view')}

#: --quick: tiny stand-ins of the measured models (development only)
QUICK_SEG = dict(embed_dims=8, num_layers=[1, 1, 1, 1],
                 num_heads=[1, 2, 2, 2])
QUICK_SEG_CHANNELS = [8, 16, 16, 16]
QUICK_CLS = dict(type='ResNet', depth=18, out_indices=(3, ),
                 style='pytorch', norm_cfg=dict(type='BN'))

#: profiler events that make the host wait for the device
SYNC_EVENTS = ('cudaStreamSynchronize', 'cudaDeviceSynchronize',
               'cudaEventSynchronize', 'cudaMemcpy', 'cudaMemcpyAsync')

#: the op behind ``.item()`` / ``float(tensor)``: a host sync on a GPU
SCALAR_READ = 'aten::_local_scalar_dense'


def free_memory():
    import torch
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


# ------------------------------------------------------------- 1. tests
def run_tests(ctx):
    """``pytest -m cuda`` in a process of its own, each test's start and
    outcome streamed into files as it happens (:mod:`.pytest_stream`).

    Raises:
        TimeoutError: If the tests ran past their time limit (after saving
            what had run by then).
    """
    from benchmarks.pytest_stream import ENV, read_outcomes
    args = ctx.args
    os.makedirs(args.out_dir, exist_ok=True)
    xml = osp.join(args.out_dir, 'cuda_tests.xml')
    log = osp.join(args.out_dir, 'cuda_tests.log')
    files = {key: osp.join(args.out_dir, f'cuda_tests_{key}.{ext}')
             for key, ext in dict(outcomes='jsonl', failures='txt',
                                  durations='tsv').items()}
    # -v without pytest.ini's -q: one line per test as it ends
    cmd = [sys.executable, '-m', 'pytest', '-m', 'cuda', '-p',
           'no:cacheprovider', '-p', 'benchmarks.pytest_stream',
           '-o', 'addopts=', '-v', '-rfEs', f'--junitxml={xml}',
           *args.test_paths]
    workers = test_workers(args.test_workers)
    if workers > 1:  # pytest-xdist: the tests share the GPU
        cmd[3:3] = ['-n', str(workers), '--dist', 'worksteal']
    for path in (xml, *files.values()):
        if osp.exists(path):
            os.remove(path)
    timeout = args.tests_timeout or TESTS_SHARE * 60 * args.budget
    # the repository first on the path (the plugin), the parent's kept
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [ctx.repo] + [p for p in [os.environ.get('PYTHONPATH')] if p]),
        **{ENV[key]: path for key, path in files.items()})
    with open(log, 'w') as out:
        proc = subprocess.Popen(cmd, cwd=ctx.repo, stdout=out, env=env,
                                stderr=subprocess.STDOUT, text=True)
        try:
            code = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            code = None
    outcomes = read_outcomes(files['outcomes'])
    result = dict(command=' '.join(['python'] + cmd[1:]), returncode=code,
                  log=log, junit=xml, failure_reports=files['failures'],
                  durations=files['durations'], workers=workers,
                  slowest=outcomes.pop('slowest')[:SLOWEST], **outcomes)
    if code is not None:  # ended: none was running
        del result['running_at_limit']
    # pytest: 0 all passed, 5 none collected (no test marked cuda)
    result['passed_all'] = code in (0, 5) and not result['failed'] \
        and not result['errors']
    print(f"[gpu_check] tests: {result['passed']} passed, "
          f"{result['failed']} failed, {result['errors']} errors, "
          f"{result['skipped']} skipped (log: {log})")
    if code is None:
        ctx.save_partial(result)
        raise TimeoutError(
            f'the CUDA tests ran past their {timeout:.0f} s (--tests-timeout,'
            f' or {TESTS_SHARE:.0%} of --budget): what had run is counted '
            f'above, the rest did not run (log {log})')
    return result


#: the tests' processes where pytest-xdist imports and none are asked for
TEST_WORKERS = 8
#: the slowest tests the report names, with their times
SLOWEST = 10


def test_workers(asked):
    """The tests step's processes: ``asked``, or (None) ``TEST_WORKERS``
    where pytest-xdist imports and else 1, said on the console.

    Raises:
        RuntimeError: If more than one is asked without pytest-xdist.
    """
    xdist = importlib.util.find_spec('xdist') is not None
    if asked is None:
        if not xdist:
            print('[gpu_check] pytest-xdist does not import: the CUDA tests '
                  'run in one process (pip install pytest-xdist for '
                  f'{TEST_WORKERS}; --test-workers)', flush=True)
        return TEST_WORKERS if xdist else 1
    if asked > 1 and not xdist:
        raise RuntimeError(
            f'--test-workers {asked} needs pytest-xdist, which does not '
            'import here: pip install pytest-xdist, or pass --test-workers 1')
    return asked


# --------------------------------------------------------- 2. step cost
@contextlib.contextmanager
def precision(task, name):
    """fp32 with TF32 off, TF32 on for matmuls and cuDNN, or bf16 autocast
    of the forward passes (TF32 off for what stays float32)."""
    import torch
    matmul, cudnn = torch.backends.cuda.matmul, torch.backends.cudnn
    adapter = task.task_adapter
    before = matmul.allow_tf32, cudnn.allow_tf32, adapter.autocast_dtype
    matmul.allow_tf32 = cudnn.allow_tf32 = name == 'tf32'
    # the loop's way: autocast around the forward passes only
    adapter.autocast_dtype = torch.bfloat16 if name == 'bf16' else None
    try:
        yield
    finally:
        matmul.allow_tf32, cudnn.allow_tf32, adapter.autocast_dtype = \
            before


def task_args(ctx, size=None):
    """The options the step benchmark's ``BenchTask`` reads."""
    return argparse.Namespace(size=tuple(size or ctx.args.seg_size),
                              ori_size=tuple(ctx.args.ori_size),
                              cls_size=ctx.args.cls_size,
                              batch_size=ctx.args.cls_batch)


def mask_size(size):
    """``size`` with each side rounded up to a multiple of ``MASK_PATCH``:
    Hybrid-TTA's input (its authors: 960x540 -> 960x544)."""
    return tuple(-(-side // MASK_PATCH) * MASK_PATCH for side in size)


def seg_task(ctx, size=None):
    """``(label, BenchTask, settings, batch)``: SegFormer-B5 with the
    NVlabs head (a tiny MiT under ``--quick``) at ``size`` (default
    ``--seg-size``)."""
    from benchmarks import step_benchmark as benchmark
    name, label = 'b5-nvlabs', 'SegFormer-B5 NVlabs head'
    if ctx.args.quick:  # a tiny stand-in, in the benchmark's own table
        name, label = 'quick-nvlabs', 'tiny SegFormer NVlabs head (--quick)'
        benchmark.SEG_MODELS[name] = (
            NVLABS_CFG.format('tent'), dict(QUICK_SEG), QUICK_SEG_CHANNELS)
    w, h = size or ctx.args.seg_size
    ow, oh = ctx.args.ori_size
    return (label, benchmark.BenchTask(name, task_args(ctx, (w, h)),
                                       ctx.device, ctx.repo),
            f'batch 1, {w}x{h}, ori_shape {ow}x{oh}, random weights', 1)


def cls_task(ctx):
    """``(label, BenchTask, settings, batch)``: the paper's ImageNet-C
    ResNet-50, torchvision's when it imports, else MMSeg's ``ResNet`` (a
    ResNet-18 under ``--quick``)."""
    import torch

    from benchmarks import step_benchmark as benchmark
    args = ctx.args
    name, label = 'resnet50', 'ResNet-50 (ImageNet-C)'
    if args.quick:
        name, label = 'quick-resnet', 'ResNet-18 (--quick)'
        benchmark.IMAGENET_MODELS[name] = (dict(QUICK_CLS), 512)
        benchmark.STAG_SETTING[name] = benchmark.STAG_SETTING['resnet50']
    task = benchmark.BenchTask(name, task_args(ctx), ctx.device, ctx.repo)
    note = (f'batch {args.cls_batch}, {args.cls_size}x{args.cls_size}, '
            'random weights, ')
    if args.quick:
        return label, task, note + "MMSeg's ResNet-18", args.cls_batch
    try:
        import torchvision
        torch.manual_seed(0)
        task.base = torchvision.models.resnet50(weights=None).eval().to(
            ctx.device)
        note += f'torchvision {torchvision.__version__} resnet50'
    except Exception as err:  # torchvision lives in .venv-real
        note += ("MMSeg's ResNet-50 (torchvision's architecture; "
                 'torchvision does not import here: '
                 f'{type(err).__name__}: {str(err)[:120]})')
    return label, task, note, args.cls_batch


def step_cost_plan(ctx):
    """``(build the task, its baselines, its MiT modes)`` in turn: the
    SegFormer at ``--seg-size``, at the size Hybrid-TTA's masks need, and
    the ResNet-50 (unless ``--skip-resnet``)."""
    methods, mit = ctx.args.seg_methods, ctx.args.mit
    graphs = [m for m in methods if m in GRAPH_METHODS]
    if not ctx.cuda and graphs:  # --allow-cpu
        print(f'[gpu_check] {" ".join(graphs)} (CUDA graphs) need a CUDA '
              'device: not run', flush=True)
        methods = [m for m in methods if m not in GRAPH_METHODS]
    plan = [(seg_task, [m for m in methods if m != 'hybrid_tta'], mit),
            (lambda c: seg_task(c, mask_size(c.args.seg_size)),
             [m for m in methods if m == 'hybrid_tta'], mit),
            (cls_task, [] if ctx.args.skip_resnet else
             ['tent'] + [m for m in methods if m == 'tent_graph'], [None])]
    return [entry for entry in plan if entry[1]]


def pair_seconds(ctx, plan):
    """Seconds of timed pairs each step-cost row gets from the budget:
    its share of what is left once the later steps' time is set aside."""
    rows = len(ctx.args.precisions) * sum(
        len(kinds) * len(modes) for _, kinds, modes in plan)
    later = FIXED_STEPS_S if {'loader', 'loop', 'profile'} & set(
        ctx.args.only) else 0.0
    left = ctx.t0 + 60 * ctx.args.budget - time.perf_counter() - later
    return PAIRS_SHARE * max(left - rows * ROW_OVERHEAD_S, 0.0) / rows


def time_arms(task, ctx, kind, stag, pairs):
    """Whole-step seconds of ``kind`` and ``kind+stag``, interleaved (A B,
    B A, ...): ``pairs`` rounds, or (None) as many as
    ``ctx.pair_seconds`` allows within ``--min-pairs`` .. ``--max-pairs``.
    STAG's share is the ratio of each pair's steps: no part of a step is
    timed alone."""
    from benchmarks.meters import StepTimer
    args = ctx.args
    batch = task.batch_for(kind)
    arms = {kind: task.make_method(kind, None)[0],
            f'{kind}+stag': task.make_method(kind, stag)[0]}
    times = {label: [] for label in arms}
    for _ in range(args.warmup):
        for label in arms:
            task.ours_step(arms[label], batch)
    t0, i = time.perf_counter(), 0
    while i < (pairs or args.max_pairs) and (
            pairs or i < args.min_pairs
            or time.perf_counter() - t0 < ctx.pair_seconds):
        order = list(arms) if i % 2 == 0 else list(reversed(arms))
        for label in order:
            with StepTimer(cuda=ctx.cuda) as timer:
                task.ours_step(arms[label], batch)
            times[label].append(timer.seconds)
        i += 1
    del arms
    free_memory()
    return times


def arm_memory(task, ctx, kind, stag):
    """Peak memory of one step of one arm, alone on the device (the
    benchmark's source copy of the model moved off for the step); a graphed
    arm's, of a replayed step."""
    from benchmarks.meters import PeakMemory
    batch = task.batch_for(kind)
    method, _ = task.make_method(kind, stag)
    task.base.to('cpu')
    free_memory()
    warmup = ctx.args.memory_warmup
    if getattr(method, 'bench_step', None) is not None:
        # a graphed arm: its eager warm-up steps and the capture first, so
        # that the measured step is a replay
        from benchmarks.step_benchmark import GRAPH_WARMUP
        warmup = max(warmup, GRAPH_WARMUP + 1)
    try:
        for _ in range(warmup):
            task.ours_step(method, batch)
        free_memory()
        with PeakMemory() as mem:
            task.ours_step(method, batch)
    finally:
        del method
        free_memory()
        task.base.to(ctx.device)
    mb = 2**20
    if ctx.cuda:
        return dict(peak_allocated_mb=mem.peak / mb,
                    peak_reserved_mb=mem.peak_reserved / mb,
                    allocated_at_start_mb=mem.start / mb,
                    step_increase_mb=mem.delta_mb)
    return dict(peak_rss_mb=mem.peak / mb, step_increase_mb=mem.delta_mb)


def cost_row(model, note, batch, name, kind, times, memory):
    """One model x baseline x precision (x MiT mode): each arm's figures
    and STAG's share, the paired whole steps' ratio."""
    from benchmarks.step_benchmark import ratio_stats
    plus = f'{kind}+stag'
    median = {label: statistics.median(t) for label, t in times.items()}
    base, stag = median[kind], median[plus]
    key = 'peak_allocated_mb' if 'peak_allocated_mb' in memory[kind] \
        else 'peak_rss_mb'
    return dict(
        model=model, settings=note, method=kind, precision=name,
        batch=batch, pairs=len(times[kind]),
        arms={label: dict(step_ms=1e3 * median[label],
                          fastest_ms=1e3 * min(times[label]),
                          images_per_s=batch / median[label], **memory[label])
              for label in times},
        stag_time_share_pct=100 * (stag - base) / base,
        stag_pair_ratio=ratio_stats(times[kind], times[plus]),
        stag_memory_share_pct=100 * (
            memory[plus][key] / memory[kind][key] - 1),
        memory_key=key)


def method_cost(ctx, built, kind):
    """:func:`cost_row` of baseline ``kind`` at each ``--precisions``,
    each yielded as it is measured."""
    model, task, note, batch = built
    stag = task.stag[kind]
    config = task.config_of(kind)
    note = f'{note}, method: {config}'
    pairs = ctx.args.pairs if kind in ('tent', 'tent_graph') \
        else ctx.args.method_pairs
    for name in ctx.args.precisions:
        with precision(task, name):
            times = time_arms(task, ctx, kind, stag, pairs)
            memory = {kind: arm_memory(task, ctx, kind, None),
                      f'{kind}+stag': arm_memory(task, ctx, kind, stag)}
        row = dict(cost_row(model, note, batch, name, kind, times, memory),
                   config=config)
        yield row
        print(f"[gpu_check] {model} {kind} {name}: "
              f"{row['arms'][kind]['step_ms']:.1f} ms, +STAG "
              f"{row['arms'][kind + '+stag']['step_ms']:.1f} ms "
              f"({row['stag_time_share_pct']:+.2f} %), memory "
              f"{row['stag_memory_share_pct']:+.3f} %", flush=True)


def measure_step_cost(ctx):
    from mmseg_stag.segmentation.models import use_attention
    rows = []
    plan = step_cost_plan(ctx)
    ctx.pair_seconds = pair_seconds(ctx, plan)
    print(f'[gpu_check] step_cost: {ctx.pair_seconds:.1f} s of timed pairs '
          'per row from the budget', flush=True)
    for build, kinds, modes in plan:
        label, task, note, batch = build(ctx)
        for mode in modes:
            if mode is not None:  # the same weights, other forwards
                use_attention(task.base, *MIT_MODES[mode])
                label = label.split(',')[0] + (
                    f', MiT {mode}' if mode != 'mmseg' else '')
            for kind in kinds:
                for row in method_cost(ctx, (label, task, note, batch), kind):
                    rows.append(dict(row, mit=mode))
                    ctx.save_partial(dict(rows=rows))
        del task
        free_memory()
    return dict(rows=rows, pair_seconds=ctx.pair_seconds)


# ------------------------------------------------------------ 3. loader
def stream_loader_cfg(ctx, workers):
    """The NVlabs TENT config's test loader on the generated stream."""
    from mmengine.config import Config
    cfg = Config.fromfile(osp.join(ctx.repo, NVLABS_CFG.format('tent')))
    cfg.merge_from_dict(ctx.seg_options())
    loader = copy.deepcopy(cfg.test_dataloader)
    loader.dataset.data_root = ctx.data_root()
    loader.dataset.rounds = 1
    loader.num_workers = workers
    loader.persistent_workers = False
    return loader


def measure_loader(ctx):
    """Images/s of the stream's loader alone, per worker count (from the
    first batch on; the workers' start-up separately)."""
    from mmengine.registry import init_default_scope
    from mmengine.runner import Runner

    import mmseg_stag  # noqa: F401  (the ACDC dataset)
    init_default_scope('mmseg')
    rows = []
    for workers in ctx.args.workers:
        # the config first: its data_root() may generate the stream
        cfg = stream_loader_cfg(ctx, workers)
        t0 = time.perf_counter()
        loader = Runner.build_dataloader(cfg, seed=0)
        batches = iter(loader)
        next(batches)
        first = time.perf_counter()
        n = 1 + sum(1 for _ in batches)
        end = time.perf_counter()
        rows.append(dict(workers=workers, images=n,
                         startup_s=first - t0,
                         images_per_s=(n - 1) / (end - first)
                         if n > 1 else None))
        print(f'[gpu_check] loader, {workers} workers: '
              f"{rows[-1]['images_per_s'] or 0:.1f} images/s", flush=True)
        del loader, batches
    sizes = [osp.getsize(osp.join(d, f)) for d, _, files in os.walk(
        osp.join(ctx.data_root(), 'rgb_anon')) for f in files
        if f.endswith('.png')]
    return dict(rows=rows, images=dict(
        size=list(ctx.args.image_size), count=4 *
        ctx.args.images_per_condition,
        mean_mb=statistics.mean(sizes) / 2**20,
        format='PNG of per-class colours and noise (demo_data generator)'),
        pipeline='configs/_base_/datasets/acdc_continual.py: load, resize '
        'to {}x{} (keep ratio), load the label, pack; batch 1'.format(
            *stream_loader_cfg(ctx, 0).dataset.pipeline[1].scale))


# -------------------------------------------------------------- 4. loop
def loop_args(ctx, methods, images, warmup):
    """The settings of the loop benchmark's runs (those of
    ``tools/benchmark_loop.py``'s command line)."""
    return argparse.Namespace(
        checkpoint=ctx.checkpoint(), data_root=ctx.data_root(),
        config_pattern=osp.join(ctx.repo, NVLABS_CFG), methods=list(methods),
        images=images, warmup=warmup, cfg_options=ctx.seg_options())


def faithful_of(method):
    """The faithful config's method of fast preset ``method``
    (``tent-stag_bf16-graph`` -> ``tent-stag``), None for a faithful one."""
    m = PRESET_NAME.fullmatch(method)
    return m.group('faithful') if m else None


def loop_plan(ctx):
    """``[(method, images)]``: ``--loop-methods`` with each count (default
    ``--loop-images``), else TENT and TENT+STAG, and on CUDA TENT+STAG's
    fast preset."""
    plan = ctx.args.loop_methods or [
        (m, None) for m in LOOP_DEFAULT + (LOOP_CUDA_DEFAULT if ctx.cuda
                                           else ())]
    return [(m, images or ctx.args.loop_images) for m, images in plan]


def needs_cuda(ctx, method):
    """Whether ``method``'s config is a named preset (``test_cfg.preset``),
    whose run stops before the stream without CUDA."""
    from mmengine.config import Config

    from benchmarks.loop_benchmark import method_config
    cfg = Config.fromfile(method_config(osp.join(ctx.repo, NVLABS_CFG),
                                        method))
    return cfg.get('test_cfg', {}).get('preset') is not None


def score_deltas(preset, faithful):
    """``[dict(stage, round, condition, preset, faithful, delta)]``: the
    stages both runs scored (a score of None or NaN left out), delta =
    preset - faithful in points."""
    def key(s):
        return s['stage'], s['round'], s['condition']

    def number(v):
        return v is not None and not math.isnan(v)

    theirs = {key(s): s['score'] for s in faithful or []}
    return [dict(stage=s['stage'], round=s['round'],
                 condition=s['condition'], preset=s['score'],
                 faithful=theirs[key(s)],
                 delta=s['score'] - theirs[key(s)])
            for s in preset or [] if key(s) in theirs
            and number(s['score']) and number(theirs[key(s)])]


def ratio(a, b):
    return a / b if a is not None and b else None


def pair_presets(methods):
    """Each fast preset of ``methods`` (the loop step's rows by method)
    beside its faithful config when both ran: on the same images, the
    preset's images/s over the faithful's (after the warm-up and over the
    whole stream), the peak memory of each and the stage scores' largest
    absolute and mean difference (preset - faithful, mIoU points); on
    different counts, a note and no comparison."""
    pairs = []
    for preset, row in methods.items():
        faithful = faithful_of(preset)
        base = methods.get(faithful)
        if faithful is None or base is None or 'ok' != row.get(
                'status', 'ok') or 'ok' != base.get('status', 'ok'):
            continue
        pair = dict(preset=preset, faithful=faithful,
                    images=row['images'],
                    same_images=row['images'] == base['images'])
        if not pair['same_images']:
            pair['note'] = (f"not on the same images ({row['images']} vs "
                            f"{base['images']}): not compared")
            pairs.append(pair)
            continue
        deltas = score_deltas(row.get('stages'), base.get('stages'))
        pair.update(
            speedup=ratio(row['images_per_second'],
                          base['images_per_second']),
            whole_speedup=ratio(row.get('whole_images_per_second'),
                                base.get('whole_images_per_second')),
            peak_allocated_mb=dict(preset=row.get('peak_allocated_mb'),
                                   faithful=base.get('peak_allocated_mb')),
            stages=deltas,
            max_abs_delta=max((abs(d['delta']) for d in deltas),
                              default=None),
            mean_delta=statistics.mean(d['delta'] for d in deltas)
            if deltas else None)
        pairs.append(pair)
    return pairs


def loop_settings(ctx, plan):
    w, h = ctx.args.image_size
    return ('configs/stag_acdc/segformer_mit-b5-nvlabs_acdc-continual_'
            '{%s}.py as tools/test.py runs them (each config as it is: its '
            'precision, loader workers and pin_memory, CUDA graphs), random '
            'weights, the generated stream (%d %dx%d PNGs)' % (
                ','.join(m for m, _ in plan),
                len(CONDITIONS) * ctx.args.images_per_condition, w, h))


def measure_loop(ctx):
    """The whole online loop (tools/benchmark_loop.py) of each
    ``loop_plan`` method in turn, each a run of its config as it is; a
    fast preset beside its faithful config (:func:`pair_presets`). A run
    that fails is reported and the next runs; a preset is left out,
    said, without CUDA (its run stops before the stream). The report is
    rewritten before and after each run (``ctx.save_partial``).

    Raises:
        RuntimeError: If a run failed (after all ran), naming each.
    """
    from benchmarks.loop_benchmark import run_method
    plan = loop_plan(ctx)
    rows = {}
    result = dict(methods=rows, images=ctx.args.loop_images,
                  warmup=ctx.args.loop_warmup, pairs=[],
                  settings=loop_settings(ctx, plan))
    loop_args(ctx, [], 1, 0)  # the stream and the weights, made once
    result['generate_seconds'] = getattr(ctx, 'generate_seconds', None)
    for k, (method, images) in enumerate(plan, 1):
        if not ctx.cuda and needs_cuda(ctx, method):
            rows[method] = dict(status='skipped', images_asked=images,
                                reason='a fast preset: needs CUDA')
            print(f'[gpu_check] loop {method}: a fast preset needs a CUDA '
                  'device: not run', flush=True)
            ctx.save_partial(result)
            continue
        print(f'[gpu_check] loop {k}/{len(plan)} {method}: {images} images',
              flush=True)
        rows[method] = dict(status='running', images_asked=images)
        ctx.save_partial(result)
        args = loop_args(ctx, [method], images, ctx.args.loop_warmup)
        try:
            row = run_method(method, args, osp.join(ctx.tmp, 'loop'))
            rows[method] = dict(status='ok', images_asked=images, **row)
            print(f"[gpu_check] loop {method}: "
                  f"{row['images_per_second'] or 0:.2f} images/s, "
                  f"{row['seconds']:.1f} s, peak "
                  + ('–' if row['peak_allocated_mb'] is None
                     else f"{row['peak_allocated_mb']:.0f}") + ' MB, mIoU '
                  + ('–' if row['mIoU'] is None else f"{row['mIoU']:.2f}"),
                  flush=True)
        except Exception as err:  # reported; the next run still runs
            rows[method] = dict(status='failed', images_asked=images,
                                error=f'{type(err).__name__}: {err}',
                                traceback=traceback.format_exc()[-4000:])
            print(f'[gpu_check] loop {method} FAILED:\n'
                  + rows[method]['traceback'], file=sys.stderr, flush=True)
        try:
            free_memory()
        except Exception as err:  # e.g. a CUDA error of the run
            rows[method].setdefault('error', f'after the run: '
                                    f'{type(err).__name__}: {err}')
            rows[method]['status'] = 'failed'
        result['pairs'] = pair_presets(rows)
        ctx.save_partial(result)
    failed = [m for m, row in rows.items() if row['status'] == 'failed']
    if failed:
        raise RuntimeError(
            f'loop: {len(failed)} of {len(plan)} runs failed (the others '
            'are reported): ' + '; '.join(
                f"{m}: {rows[m]['error'][:300]}" for m in failed))
    return result


# ----------------------------------------------------------- 5. profile
def device_us(event):
    """Self device (kernel) microseconds of a profiler entry."""
    for name in ('self_device_time_total', 'self_cuda_time_total'):
        if hasattr(event, name):
            return getattr(event, name)
    return 0


def summarize_profile(ctx, what, prof, count, wall_s, extra):
    """Per step/iteration: kernel time, host syncs, scalar reads, loader
    wait, the operators with the most kernel time, and ``extra``; with
    ``--trace``, the profile as ``profile_<what>.json``."""
    if ctx.args.trace:
        prof.export_chrome_trace(osp.join(ctx.args.out_dir,
                                          f'profile_{what}.json'))
    averages = prof.key_averages()
    kernel_ms = sum(device_us(e) for e in averages) / 1e3
    syncs = {e.key: dict(calls=e.count / count,
                         host_ms=e.cpu_time_total / 1e3 / count)
             for e in averages if e.key in SYNC_EVENTS}
    scalar = sum(e.count for e in averages if e.key == SCALAR_READ)
    loader = sum(e.cpu_time_total for e in averages
                 if e.key.startswith('enumerate(DataLoader)'))
    top = sorted(averages, key=device_us, reverse=True)[:10]
    return dict(
        count=count, wall_ms=1e3 * wall_s / count,
        cuda_kernel_ms=kernel_ms / count if ctx.cuda else None,
        gpu_busy_pct=100 * kernel_ms / (1e3 * wall_s) if ctx.cuda and wall_s
        else None,
        host_syncs=syncs,
        host_sync_ms=sum(s['host_ms'] for s in syncs.values()),
        scalar_reads=scalar / count,
        loader_wait_ms=loader / 1e3 / count,
        top_kernel_ops=[dict(op=e.key[:90], kernel_ms=device_us(e) / 1e3 /
                             count, calls=e.count / count) for e in top
                        if device_us(e) > 0], **extra)


def profiler(ctx):
    from torch.profiler import ProfilerActivity, profile
    activities = [ProfilerActivity.CPU] + (
        [ProfilerActivity.CUDA] if ctx.cuda else [])
    return profile(activities=activities)


def sync(ctx):
    import torch
    if ctx.cuda:
        torch.cuda.synchronize()


def profile_steps(ctx, task, fused=False):
    """TENT+STAG steps alone (no loader, no metric), its Adam as the
    config's or ``fused``, and one step's host-device transfers."""
    from benchmarks.meters import HostTransfers
    optimizer = dict(task.methods['tent'].get('optimizer') or dict(
        type='Adam', lr=7.5e-6, betas=(0.9, 0.999)))
    if fused:
        optimizer['fused'] = True
    method, _ = task.make_method('tent', task.stag['tent'],
                                 optimizer=optimizer)
    for _ in range(ctx.args.profile_warmup):
        task.ours_step(method)
    sync(ctx)
    with HostTransfers() as transfers:
        task.ours_step(method)
    sync(ctx)
    prof = profiler(ctx)
    t0 = time.perf_counter()
    with prof:
        for _ in range(ctx.args.profile_steps):
            task.ours_step(method)
        sync(ctx)  # ours: the kernels must end inside the profile
    wall = time.perf_counter() - t0
    own = 'one device synchronisation per profile is the tool\'s own'
    return summarize_profile(ctx, 'step', prof, ctx.args.profile_steps, wall,
                             dict(note=own, optimizer=optimizer,
                                  transfers=dict(transfers.kinds),
                                  transfer_sites=transfers.top_sites()))


def iteration_profiler(ctx, start, count):
    """An observing hook: profiles loop iterations ``start ..
    start + count - 1`` from the end of the one before (the loader's fetch
    inside), and times each wait from an iteration's end to the next."""
    from mmengine.hooks import Hook

    class IterationProfiler(Hook):
        priority = 'LOWEST'

        def __init__(self):
            self.prof, self.waits, self._end = None, [], None

        def before_test_iter(self, runner, batch_idx, data_batch=None):
            if self.prof is not None and self._end is not None:
                self.waits.append(time.perf_counter() - self._end)

        def after_test_iter(self, runner, batch_idx, data_batch=None,
                            outputs=None):
            if batch_idx == start - 1:
                sync(ctx)
                self.prof = profiler(ctx)
                self.prof.__enter__()
                self.t0 = time.perf_counter()
            elif batch_idx == start + count - 1 and self.prof is not None:
                sync(ctx)
                self.wall = time.perf_counter() - self.t0
                self.prof.__exit__(None, None, None)
                self._end = None
                return
            self._end = time.perf_counter()

    return IterationProfiler()


def profile_loop(ctx):
    """TENT+STAG loop iterations: load, step, post-processing, metric."""
    from benchmarks.loop_benchmark import build_runner
    start, count = ctx.args.profile_warmup + 1, ctx.args.profile_iters
    args = loop_args(ctx, ['tent-stag'], start + count, 0)
    runner = build_runner(
        osp.join(ctx.repo, NVLABS_CFG.format('tent-stag')), args,
        osp.join(ctx.tmp, 'profile'), 'tent-stag')
    hook = iteration_profiler(ctx, start, count)
    runner.register_hook(hook)
    runner.test()
    waits = hook.waits[:count]
    return summarize_profile(ctx, 'loop', hook.prof, count, hook.wall, dict(
        loader_wait_wall_ms=1e3 * statistics.mean(waits) if waits else None))


def measure_profile(ctx):
    model, task, note, _ = seg_task(ctx)
    with precision(task, 'fp32'):
        steps = profile_steps(ctx, task)
        fused = profile_steps(ctx, task, fused=True)
    del task
    free_memory()
    return dict(model=model, settings=note, step=steps, step_fused=fused,
                loop=profile_loop(ctx))


# ------------------------------------------------------------- report
MEASURES = dict(step_cost=measure_step_cost, loader=measure_loader,
                loop=measure_loop, profile=measure_profile)
