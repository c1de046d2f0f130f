"""GPU check: the CUDA tests and the GPU measurements, one command, one
report (docs/benchmark.md#gpu-check).

    make gpu-check    # tools/gpu_check.py --out-dir work_dirs/gpu_check
    python tools/gpu_check.py [--only tests step_cost loader loop profile]
        [--pairs 30] [--precisions fp32 tf32 bf16] [--workers 2 8] ...

On one CUDA device (random weights, a generated stream) it runs the steps
``tests`` (``pytest -m cuda``), ``step_cost`` (TENT, CoTTA and Hybrid-TTA on
SegFormer-B5 as MMSeg runs its MiT and with its GPU options, TENT on
ResNet-50,
each against its +STAG arm), ``loader``, ``loop`` and ``profile``, each
timed, a failing one reported while the next still runs, into
``gpu_check.{json,md}`` in ``--out-dir``, rewritten after every step and
every step-cost row (a run killed at its time limit keeps what it
measured). ``--budget`` (minutes) picks the counts left open. Exit status: 0
when the tests passed and every step ran, 1 otherwise, 2 without CUDA
(nothing runs). ``--allow-cpu --quick`` (development only) checks the tool
on the CPU with tiny sizes; it measures nothing.
"""
import argparse
import contextlib
import copy
import gc
import json
import multiprocessing
import os
import os.path as osp
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
import xml.etree.ElementTree as ET
from concurrent.futures import ProcessPoolExecutor
from datetime import datetime, timezone

REPO = osp.dirname(osp.dirname(osp.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

STEPS = ('tests', 'step_cost', 'loader', 'loop', 'profile')
#: step_cost's SegFormer baselines, each against its +STAG arm; cotta_fast
#: is CoTTA with restore_on_device and batch_views, tent_graph TENT with
#: cuda_graph=True (the ResNet-50 runs it too when it is named)
SEG_METHODS = ('tent', 'tent_graph', 'cotta', 'cotta_fast', 'hybrid_tta')
#: Hybrid-TTA masks 32-px patches: its input's sides are multiples of 32
MASK_PATCH = 32
PRECISIONS = ('fp32', 'tf32', 'bf16')
#: the paper's segmentation config (NVlabs head, D = 768) and its pattern
NVLABS_CFG = ('configs/stag_acdc/'
              'segformer_mit-b5-nvlabs_acdc-continual_{}.py')
#: what the default run should take (minutes): a 10-minute GPU slot
BUDGET_MIN = 9.0
#: shares of the budget: the tests (their time limit) and what loader,
#: loop and profile took on one H100 (75 s, shared/gpu-reports 2026-11-27)
TESTS_SHARE, FIXED_STEPS_S = 0.35, 90.0
#: what a step-cost row takes besides its timed pairs (building the model,
#: each arm's memory, the STAG term alone): 7-14 s on the H100 (second
#: run of 2026-11-27: 12 TENT rows in 101 s, 14 rows with CoTTA and
#: Hybrid-TTA in 293 s), and what the timed pairs get of the rest
ROW_OVERHEAD_S, PAIRS_SHARE = 12.0, 0.8
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
#: integer options: (flag, default, least value allowed or None, help)
COUNTS = (
    ('--tests-timeout', None, None, 'seconds before the tests step is '
     'stopped (default: its share of --budget)'),
    ('--pairs', None, 1, 'measured TENT / TENT+STAG step pairs '
     '(step_cost; default: as many as the budget gives each row, at least '
     '--min-pairs, at most --max-pairs)'),
    ('--method-pairs', None, 1, 'measured step pairs of the costlier '
     'segmentation baselines, CoTTA / Hybrid-TTA ± STAG (step_cost; '
     'default: as --pairs)'),
    ('--min-pairs', 5, 1, 'fewest step pairs of a row the budget picks'),
    ('--max-pairs', 400, 1, 'most step pairs of a row the budget picks'),
    ('--warmup', 3, None, 'untimed step pairs first (step_cost)'),
    ('--memory-warmup', 1, None, 'steps of each arm before its memory is '
     'measured'),
    ('--term-repeats', 50, 1, 'timings of the STAG term alone (step_cost)'),
    ('--cls-batch', 64, None, 'ResNet-50 batch size (paper: 64)'),
    ('--cls-size', 224, None, 'ResNet-50 input side (224)'),
    ('--images-per-condition', 16, 1, 'generated images per ACDC '
     'condition (4 conditions)'),
    ('--loop-images', 48, 1, 'images of the whole-loop run per method'),
    ('--loop-warmup', 8, None, 'loop images before its timing starts'),
    ('--profile-steps', 3, 1, 'TENT+STAG steps profiled'),
    ('--profile-iters', 3, 1, 'loop iterations profiled'),
    ('--profile-warmup', 3, None, 'steps / loop iterations before '
     'profiling'),
)
#: profiler events that make the host wait for the device
SYNC_EVENTS = ('cudaStreamSynchronize', 'cudaDeviceSynchronize',
               'cudaEventSynchronize', 'cudaMemcpy', 'cudaMemcpyAsync')
#: the op behind ``.item()`` / ``float(tensor)``: a host sync on a GPU
SCALAR_READ = 'aten::_local_scalar_dense'


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        description='CUDA tests and GPU measurements (step cost and '
        'memory of each baseline vs +STAG, loader, whole loop, profile) '
        'into one report; needs a CUDA device')
    p.add_argument('--out-dir', default='work_dirs/gpu_check',
                   help='where gpu_check.{md,json} and the tests\' log go')
    p.add_argument('--only', nargs='+', choices=STEPS, default=list(STEPS),
                   help='steps to run (default: all)')
    p.add_argument('--test-paths', nargs='+', default=['tests'],
                   help='what pytest -m cuda collects (default: tests)')
    p.add_argument('--precisions', nargs='+', choices=PRECISIONS,
                   default=['fp32', 'bf16'], help='step_cost precisions '
                   '(default: fp32 bf16)')
    p.add_argument('--mit', nargs='+', choices=list(MIT_MODES),
                   default=['sdpa-views'], help="step_cost's MiT: "
                   "MMSeg's, its attention through SDPA, and also its "
                   'convolutions on views of the tokens (default: '
                   "sdpa-views, which fits the budget; MMSeg's against it "
                   'was measured on the H100 on 2026-11-27)')
    p.add_argument('--seg-methods', nargs='+', choices=SEG_METHODS,
                   default=['tent', 'tent_graph', 'cotta_fast',
                            'hybrid_tta'],
                   help="step_cost's SegFormer baselines (default: tent "
                   "tent_graph cotta_fast hybrid_tta; cotta, the authors' "
                   'way, was measured on the H100 on 2026-11-27; '
                   'ResNet-50: TENT, and tent_graph when named)')
    for flag, default, _, text in COUNTS:
        p.add_argument(flag, type=int, default=default, help=text)
    p.add_argument('--seg-size', type=int, nargs=2, default=(960, 540),
                   metavar=('W', 'H'), help='SegFormer input (paper: 960 '
                   '540)')
    p.add_argument('--image-size', type=int, nargs=2, default=(1920, 1080),
                   metavar=('W', 'H'),
                   help='generated stream images (ACDC: 1920 1080)')
    p.add_argument('--workers', type=int, nargs='+', default=[2, 8],
                   help='loader worker counts to compare')
    p.add_argument('--trace', action='store_true',
                   help='also write the profiles as Chrome traces')
    p.add_argument('--budget', '--budget-min', type=float,
                   default=BUDGET_MIN, help='minutes the whole check may '
                   'take: the tests get 35 %%, the step-cost pairs what is '
                   'left after the fixed steps (default: %(default)s)')
    # development only: the pipeline on the CPU with tiny sizes
    p.add_argument('--allow-cpu', action='store_true',
                   help=argparse.SUPPRESS)
    p.add_argument('--quick', action='store_true', help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    for flag, _, least, _ in COUNTS:
        value = getattr(args, flag[2:].replace('-', '_'))
        if least is not None and value is not None and value < least:
            p.error(f'{flag} must be >= {least}')
    if args.budget <= 0:
        p.error('--budget must be > 0 minutes')
    if args.min_pairs > args.max_pairs:
        p.error('need --min-pairs <= --max-pairs')
    if not 0 <= args.loop_warmup < args.loop_images:
        p.error('need 0 <= --loop-warmup < --loop-images')
    if args.quick:
        make_quick(args)
    return args


def make_quick(args):
    """Tiny sizes and counts (``--quick``): the pipeline in seconds."""
    args.test_paths = ['tests/cuda']
    # CoTTA's smallest teacher view (ratio 0.5) needs 32 px a side
    args.seg_size, args.cls_batch, args.cls_size = (128, 64), 2, 32
    args.image_size, args.images_per_condition = (96, 48), 2
    # bf16 convolutions are ~25x slower than fp32 on a CPU without bf16
    # units, TF32 is a GPU flag: fp32 only (tests/tools cover the others)
    args.precisions, args.mit = ['fp32'], ['mmseg', 'sdpa-views']
    args.pairs = args.method_pairs = 1
    args.warmup, args.memory_warmup, args.term_repeats = 0, 0, 1
    args.workers = [1, 2]
    args.loop_images, args.loop_warmup = 3, 1
    args.profile_steps = args.profile_iters = args.profile_warmup = 1


# ------------------------------------------------------------ environment
def driver_version():
    """The NVIDIA driver (nvidia-smi), else the CUDA driver API version."""
    try:
        out = subprocess.run(
            ['nvidia-smi', '--query-gpu=driver_version',
             '--format=csv,noheader'], capture_output=True, text=True,
            timeout=20)
        if out.returncode == 0 and out.stdout.strip():
            return out.stdout.strip().splitlines()[0]
    except (OSError, subprocess.TimeoutExpired):
        pass
    import torch
    try:
        v = torch._C._cuda_getDriverVersion()
        return f'CUDA driver API {v // 1000}.{v % 1000 // 10}'
    except (AttributeError, RuntimeError):
        return None


def package_version(name):
    from importlib import metadata
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def environment(device):
    """The machine and software the figures come from."""
    import torch
    env = dict(
        date=datetime.now(timezone.utc).isoformat(timespec='seconds'),
        device=device, platform=platform.platform(),
        python=platform.python_version(), cpus=os.cpu_count(),
        torch=torch.__version__, cuda_runtime=torch.version.cuda,
        cudnn=torch.backends.cudnn.version()
        if torch.backends.cudnn.is_available() else None,
        mmengine=package_version('mmengine'), mmcv=package_version('mmcv'),
        mmsegmentation=package_version('mmsegmentation'),
        torchvision=package_version('torchvision'))
    if device == 'cuda':
        props = torch.cuda.get_device_properties(0)
        env.update(gpu=torch.cuda.get_device_name(0),
                   capability='{}.{}'.format(
                       *torch.cuda.get_device_capability(0)),
                   gpu_memory_gib=round(props.total_memory / 2**30, 1),
                   gpu_count=torch.cuda.device_count(),
                   driver=driver_version())
    return env


def no_gpu_message():
    import torch
    return (f'gpu_check: no GPU: torch.cuda.is_available() is False (torch '
            f'{torch.__version__}, built for CUDA {torch.version.cuda}). '
            'Nothing was run: this check needs a CUDA device (the CPU '
            'suite is `make test`).')


# ------------------------------------------------------------------ steps
class Context:
    """What the steps share: the options, the device, a temporary folder
    with the generated stream and the random B5 checkpoint (made once)."""

    def __init__(self, args, device):
        self.args, self.device = args, device
        self.t0 = time.perf_counter()  # the budget's start
        self.save_partial = lambda result: None  # run_step sets it
        self.tmp = tempfile.mkdtemp(prefix='gpu_check_')
        self._data_root = self._checkpoint = None

    @property
    def cuda(self):
        return self.device == 'cuda'

    def seg_options(self):
        """``--cfg-options`` of the NVlabs configs (tiny under --quick)."""
        if not self.args.quick:
            return {}
        w, h = self.args.seg_size
        opts = {'model.decode_head.in_channels': QUICK_SEG_CHANNELS,
                'model.decode_head.channels': 16,
                'model.decode_head.embedding_dim': 16,
                'test_dataloader.dataset.pipeline.1.scale': (w, h)}
        opts.update({f'model.backbone.{k}': v for k, v in QUICK_SEG.items()})
        return opts

    def data_root(self):
        """The generated ACDC-layout stream (``--image-size`` PNGs), one
        process per condition."""
        if self._data_root is None:
            root = osp.join(self.tmp, 'acdc')
            t0 = time.perf_counter()
            conditions = ('fog', 'night', 'rain', 'snow')
            context = multiprocessing.get_context('spawn')
            with ProcessPoolExecutor(min(4, os.cpu_count() or 1),
                                     mp_context=context) as pool:
                list(pool.map(generate_condition, [
                    (root, c, self.args.images_per_condition,
                     tuple(self.args.image_size), k)
                    for k, c in enumerate(conditions)]))
            print(f'[gpu_check] generated {4 * self.args.images_per_condition}'
                  f' {self.args.image_size[0]}x{self.args.image_size[1]} '
                  f'images in {time.perf_counter() - t0:.1f} s', flush=True)
            self._data_root = root
        return self._data_root

    def checkpoint(self):
        """Random weights of the NVlabs B5 config, as a plain checkpoint."""
        if self._checkpoint is None:
            import torch
            from mmengine.config import Config
            from mmengine.registry import init_default_scope
            from mmseg.registry import MODELS
            cfg = Config.fromfile(osp.join(REPO, NVLABS_CFG.format('tent')))
            cfg.merge_from_dict(self.seg_options())
            init_default_scope('mmseg')
            torch.manual_seed(0)
            model = MODELS.build(cfg.model)
            path = osp.join(self.tmp, 'random_b5_nvlabs.pth')
            torch.save({'state_dict': model.state_dict(), 'meta': {}}, path)
            self._checkpoint = path
        return self._checkpoint

    def close(self):
        shutil.rmtree(self.tmp, ignore_errors=True)


def generate_condition(job):
    """One condition of the generated stream (a worker process's job)."""
    from demo_data import make_acdc_like_tree
    root, condition, count, size, seed = job
    make_acdc_like_tree(root, conditions=(condition, ),
                        images_per_condition=count, size=size, seed=seed)


def image_bytes(root):
    """Mean size of the stream's image files (bytes)."""
    sizes = [osp.getsize(osp.join(d, f)) for d, _, files in os.walk(
        osp.join(root, 'rgb_anon')) for f in files if f.endswith('.png')]
    return statistics.mean(sizes) if sizes else None


def free_memory():
    import torch
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


def run_step(name, fn, ctx, report):
    """Run one step, time it, keep its result or its error; the report is
    rewritten as the step goes (``ctx.save_partial``) and after it."""
    print(f'\n[gpu_check] === {name} ===', flush=True)
    t0 = time.perf_counter()
    entry = dict(name=name, status='running')
    report['steps'].append(entry)

    def save_partial(result):
        entry['result'] = result
        entry['seconds'] = round(time.perf_counter() - t0, 1)
        write_report(report, ctx.args.out_dir)

    ctx.save_partial = save_partial
    save_partial(None)
    try:
        entry['result'] = fn(ctx)
        entry['status'] = 'ok'
    except Exception as err:  # reported; the next step still runs
        entry['status'] = 'failed'
        entry['error'] = f'{type(err).__name__}: {err}'
        entry['traceback'] = traceback.format_exc()[-6000:]
        print(entry['traceback'], file=sys.stderr, flush=True)
    finally:
        try:
            free_memory()
        except Exception as err:  # e.g. a CUDA error of the step
            entry.setdefault('error', f'{type(err).__name__}: {err}')
            entry['status'] = 'failed'
    entry['seconds'] = round(time.perf_counter() - t0, 1)
    write_report(report, ctx.args.out_dir)
    print(f'[gpu_check] {name}: {entry["status"]} in {entry["seconds"]} s '
          f'(total {time.perf_counter() - report["_t0"]:.0f} s)', flush=True)
    return entry


# ------------------------------------------------------------- 1. tests
def junit_summary(path):
    """Counts, failures, skip reasons and recorded properties of a JUnit
    XML file written by pytest."""
    root = ET.parse(path).getroot()
    out = dict(passed=0, failed=0, errors=0, skipped=0, failures=[],
               skip_reasons={}, properties=[])
    for case in root.iter('testcase'):
        name = f'{case.get("classname")}::{case.get("name")}'
        kinds = {child.tag: child for child in case}
        if 'failure' in kinds or 'error' in kinds:
            tag = 'failure' if 'failure' in kinds else 'error'
            out['failed' if tag == 'failure' else 'errors'] += 1
            out['failures'].append(dict(
                test=name, kind=tag,
                message=(kinds[tag].get('message') or '')[:500]))
        elif 'skipped' in kinds:
            out['skipped'] += 1
            reason = kinds['skipped'].get('message') or ''
            out['skip_reasons'][reason] = out['skip_reasons'].get(
                reason, 0) + 1
        else:
            out['passed'] += 1
        for prop in case.iter('property'):
            out['properties'].append(dict(test=name, name=prop.get('name'),
                                          value=prop.get('value')))
    return out


def run_tests(ctx):
    """``pytest -m cuda`` in a process of its own, its output streamed into
    the log (one line per test: a stopped run's log says what ran).

    Raises:
        TimeoutError: If the tests ran past their time limit (the step is
            reported failed, with what had run by then).
    """
    args = ctx.args
    os.makedirs(args.out_dir, exist_ok=True)
    xml = osp.join(args.out_dir, 'cuda_tests.xml')
    log = osp.join(args.out_dir, 'cuda_tests.log')
    # -v without pytest.ini's -q: one line per test as it ends
    cmd = [sys.executable, '-m', 'pytest', '-m', 'cuda', '-p',
           'no:cacheprovider', '-o', 'addopts=', '-v', '-rfEs',
           f'--junitxml={xml}', *args.test_paths]
    if osp.exists(xml):
        os.remove(xml)
    timeout = args.tests_timeout or TESTS_SHARE * 60 * args.budget
    with open(log, 'w') as out:
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=out,
                                stderr=subprocess.STDOUT, text=True)
        try:
            code = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            code = None
    result = dict(command=' '.join(['python'] + cmd[1:]), returncode=code,
                  log=log, junit=xml)
    if osp.exists(xml):
        result.update(junit_summary(xml))
    else:  # stopped before pytest wrote it: count the log's verdicts
        result.update(log_summary(log))
    # pytest: 0 all passed, 5 none collected (no test marked cuda)
    result['passed_all'] = code in (0, 5) and not result.get('failed') \
        and not result.get('errors')
    print(f"[gpu_check] tests: {result.get('passed', 0)} passed, "
          f"{result.get('failed', 0)} failed, {result.get('errors', 0)} "
          f"errors, {result.get('skipped', 0)} skipped (log: {log})")
    if code is None:
        ctx.save_partial(result)
        raise TimeoutError(
            f'the CUDA tests ran past their {timeout:.0f} s (--tests-timeout,'
            f' or {TESTS_SHARE:.0%} of --budget): what had run is counted '
            f'above, the rest did not run (log {log})')
    return result


#: pytest -v's verdict at the end of a test's line
VERDICT = re.compile(r'^(\S+::\S+) (PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)')


def log_summary(path):
    """Counts and failed tests from the ``pytest -v`` lines of ``path``:
    the summary of a run stopped before its JUnit file."""
    out = dict(passed=0, failed=0, errors=0, skipped=0, failures=[],
               skip_reasons={}, properties=[])
    key = dict(PASSED='passed', XPASS='passed', FAILED='failed',
               ERROR='errors', SKIPPED='skipped', XFAIL='skipped')
    with open(path, errors='replace') as f:
        for line in f:
            match = VERDICT.match(line)
            if match:
                test, verdict = match.groups()
                out[key[verdict]] += 1
                if verdict in ('FAILED', 'ERROR'):
                    out['failures'].append(dict(
                        test=test, kind=verdict.lower(),
                        message='(the run was stopped: see the log)'))
    return out


# --------------------------------------------------------- 2. step cost
@contextlib.contextmanager
def precision(task, name):
    """fp32 with TF32 off, TF32 on for matmuls and cuDNN, or bf16 autocast
    of the forward passes (TF32 off for what stays float32)."""
    import torch
    matmul, cudnn = torch.backends.cuda.matmul, torch.backends.cudnn
    before = matmul.allow_tf32, cudnn.allow_tf32, task.probe.autocast_dtype
    matmul.allow_tf32 = cudnn.allow_tf32 = name == 'tf32'
    # the loop's way: autocast around the forward passes only
    task.probe.autocast_dtype = torch.bfloat16 if name == 'bf16' else None
    try:
        yield
    finally:
        matmul.allow_tf32, cudnn.allow_tf32, task.probe.autocast_dtype = \
            before


def task_args(ctx, size=None):
    """The options the step benchmark's ``BenchTask`` reads."""
    return argparse.Namespace(size=tuple(size or ctx.args.seg_size),
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
    from mmseg_stag.analysis import step_benchmark as benchmark
    name, label = 'b5-nvlabs', 'SegFormer-B5 NVlabs head'
    if ctx.args.quick:  # a tiny stand-in, in the benchmark's own table
        name, label = 'quick-nvlabs', 'tiny SegFormer NVlabs head (--quick)'
        benchmark.SEG_MODELS[name] = (
            NVLABS_CFG.format('tent'), dict(QUICK_SEG), QUICK_SEG_CHANNELS)
    w, h = size or ctx.args.seg_size
    return (label, benchmark.BenchTask(name, task_args(ctx, (w, h)),
                                       ctx.device, REPO),
            f'batch 1, {w}x{h}, random weights', 1)


def cls_task(ctx):
    """``(label, BenchTask, settings, batch)``: the paper's ImageNet-C
    ResNet-50, torchvision's when it imports (``.venv-real``), else the
    same architecture from MMSeg's ``ResNet`` (a ResNet-18 under
    ``--quick``)."""
    import torch

    from mmseg_stag.analysis import step_benchmark as benchmark
    args = ctx.args
    name, label = 'resnet50', 'ResNet-50 (ImageNet-C)'
    if args.quick:
        name, label = 'quick-resnet', 'ResNet-18 (--quick)'
        benchmark.IMAGENET_MODELS[name] = (dict(QUICK_CLS), 512)
        benchmark.STAG_SETTING[name] = benchmark.STAG_SETTING['resnet50']
    task = benchmark.BenchTask(name, task_args(ctx), ctx.device, REPO)
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
    """``(build the task, its baselines, its MiT modes)`` in turn:
    the SegFormer at ``--seg-size`` (TENT, CoTTA with the ACDC config's 14
    teacher views), at the size Hybrid-TTA's masks need, and the ResNet-50
    (TENT)."""
    methods, mit = ctx.args.seg_methods, ctx.args.mit
    if not ctx.cuda and 'tent_graph' in methods:  # --allow-cpu
        print('[gpu_check] tent_graph (CUDA graphs) needs a CUDA device: '
              'not run', flush=True)
        methods = [m for m in methods if m != 'tent_graph']
    plan = [(seg_task, [m for m in methods if m != 'hybrid_tta'], mit)]
    if 'hybrid_tta' in methods:
        plan.append((lambda c: seg_task(c, mask_size(c.args.seg_size)),
                     ['hybrid_tta'], mit))
    cls = ['tent'] + [m for m in methods if m == 'tent_graph']
    return [entry for entry in plan if entry[1]] + [(cls_task, cls, [None])]


def pair_seconds(ctx, plan):
    """Seconds of timed pairs each step-cost row gets from the budget:
    its share of what is left once the later steps' time is set aside."""
    rows = len(ctx.args.precisions) * sum(
        len(kinds) * len(modes) for _, kinds, modes in plan)
    later = FIXED_STEPS_S if {'loader', 'loop', 'profile'} & set(
        ctx.args.only) else 0.0
    left = ctx.t0 + 60 * ctx.args.budget - time.perf_counter() - later
    rows = max(rows, 1)
    return PAIRS_SHARE * max(left - rows * ROW_OVERHEAD_S, 0.0) / rows


def time_arms(task, ctx, kind, stag, pairs):
    """Whole-step seconds of ``kind`` and ``kind+stag``, interleaved (A B,
    B A, ...), CUDA events around each step and nothing inside it:
    ``pairs`` pairs, or (None) as many as ``ctx.pair_seconds`` allows
    within ``--min-pairs`` .. ``--max-pairs``."""
    from mmseg_stag.analysis.meters import StepTimer
    args = ctx.args
    arms = {kind: task.make_method(kind, None)[0],
            f'{kind}+stag': task.make_method(kind, stag)[0]}
    batch = task.batch_for(kind)
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
    benchmark's source copy of the model moved off for the step)."""
    from mmseg_stag.analysis.meters import PeakMemory
    batch = task.batch_for(kind)
    task.base.to(ctx.device)
    method, _ = task.make_method(kind, stag)
    task.base.to('cpu')
    free_memory()
    try:
        for _ in range(ctx.args.memory_warmup):
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


def arm_figures(seconds, batch, memory):
    """One arm's step time (median, fastest), images/s and memory."""
    median = statistics.median(seconds)
    return dict(step_ms=1e3 * median, fastest_ms=1e3 * min(seconds),
                images_per_s=batch / median, **memory)


def cost_row(model, note, batch, name, kind, times, memory, term):
    """One model x baseline x precision (x MiT mode): both arms' figures
    and STAG's share."""
    from mmseg_stag.analysis.step_benchmark import ratio_stats
    plus = f'{kind}+stag'
    base, stag = (statistics.median(times[k]) for k in (kind, plus))
    key = 'peak_allocated_mb' if 'peak_allocated_mb' in memory[kind] \
        else 'peak_rss_mb'
    return dict(
        model=model, settings=note, method=kind, precision=name,
        batch=batch, pairs=len(times[kind]),
        arms={label: arm_figures(times[label], batch, memory[label])
              for label in times},
        stag_time_share_pct=100 * (stag - base) / base,
        stag_pair_ratio=ratio_stats(times[kind], times[plus]),
        stag_term_ms=1e3 * term['analytic'],
        stag_term_share_pct=100 * term['analytic'] / base,
        stag_term_variants_ms={k: 1e3 * v for k, v in term.items()},
        stag_memory_share_pct=100 * (
            memory[plus][key] / memory[kind][key] - 1),
        memory_key=key)


def method_cost(ctx, built, kind, save):
    """:func:`cost_row` of baseline ``kind`` at each ``--precisions``,
    each passed to ``save`` as it is measured."""
    from mmseg_stag.analysis.step_benchmark import (TERM_VARIANTS,
                                                    time_stag_term)
    model, task, note, batch = built
    stag = task.stag[kind]
    pairs = ctx.args.pairs if kind in ('tent', 'tent_graph') \
        else ctx.args.method_pairs
    rows = []
    for name in ctx.args.precisions:
        with precision(task, name):
            times = time_arms(task, ctx, kind, stag, pairs)
            memory = {kind: arm_memory(task, ctx, kind, None),
                      f'{kind}+stag': arm_memory(task, ctx, kind, stag)}
            variants = dict(TERM_VARIANTS)
            if kind == 'tent' and name == ctx.args.precisions[0] and \
                    not ctx.args.quick:
                # compiled once per model and shape (seconds to a minute)
                variants['compiled'] = dict(compile=True)
            term = time_stag_term(task, kind, stag, ctx.args.term_repeats,
                                  variants)
        row = cost_row(model, note, batch, name, kind, times, memory, term)
        rows.append(row)
        save(row)
        print(f"[gpu_check] {model} {kind} {name}: "
              f"{row['arms'][kind]['step_ms']:.1f} ms, +STAG "
              f"{row['arms'][kind + '+stag']['step_ms']:.1f} ms "
              f"({row['stag_time_share_pct']:+.2f} %), memory "
              f"{row['stag_memory_share_pct']:+.3f} %", flush=True)
    return rows


def measure_step_cost(ctx):
    from mmseg_stag.segmentation.models import use_attention
    rows = []

    def save(row):
        rows.append(row)
        ctx.save_partial(dict(rows=rows))

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
                method_cost(ctx, (label, task, note, batch), kind,
                            lambda row: save(dict(row, mit=mode)))
        del task
        free_memory()
    return dict(rows=rows, pair_seconds=ctx.pair_seconds)


# ------------------------------------------------------------ 3. loader
def stream_loader_cfg(ctx, workers):
    """The NVlabs TENT config's test loader on the generated stream."""
    from mmengine.config import Config
    cfg = Config.fromfile(osp.join(REPO, NVLABS_CFG.format('tent')))
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
        t0 = time.perf_counter()
        loader = Runner.build_dataloader(stream_loader_cfg(ctx, workers),
                                         seed=0)
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
    return dict(rows=rows, images=dict(
        size=list(ctx.args.image_size), count=4 *
        ctx.args.images_per_condition, mean_mb=image_bytes(
            ctx.data_root()) / 2**20,
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
        config_pattern=osp.join(REPO, NVLABS_CFG), methods=list(methods),
        images=images, warmup=warmup, cfg_options=ctx.seg_options())


def measure_loop(ctx):
    """Images/s of the whole online loop (tools/benchmark_loop.py)."""
    from mmseg_stag.analysis.loop_benchmark import run_method
    args = loop_args(ctx, ['tent', 'tent-stag'], ctx.args.loop_images,
                     ctx.args.loop_warmup)
    rows = {}
    for method in args.methods:
        rows[method] = run_method(
            method, args, osp.join(ctx.tmp, 'loop'))
        print(f"[gpu_check] loop {method}: "
              f"{rows[method]['images_per_second'] or 0:.2f} images/s",
              flush=True)
        free_memory()
    return dict(methods=rows, images=args.images, warmup=args.warmup,
                settings='configs/stag_acdc/segformer_mit-b5-nvlabs_'
                'acdc-continual_{tent,tent-stag}.py as they are (float32, '
                "the config's loader), random weights, the generated stream")


# ----------------------------------------------------------- 5. profile
def device_us(event):
    """Self device (kernel) microseconds of a profiler entry."""
    for name in ('self_device_time_total', 'self_cuda_time_total'):
        if hasattr(event, name):
            return getattr(event, name)
    return 0


def summarize_profile(prof, count, wall_s, cuda, extra=None):
    """Per step/iteration: kernel time, host syncs, scalar reads, loader
    wait, and the operators with the most kernel time (the kernel and
    busy figures are None on the CPU)."""
    averages = prof.key_averages()
    kernel_ms = sum(device_us(e) for e in averages) / 1e3 if cuda else None
    syncs = {e.key: dict(calls=e.count / count,
                         host_ms=e.cpu_time_total / 1e3 / count)
             for e in averages if e.key in SYNC_EVENTS}
    scalar = sum(e.count for e in averages if e.key == SCALAR_READ)
    loader = sum(e.cpu_time_total for e in averages
                 if e.key.startswith('enumerate(DataLoader)'))
    top = sorted(averages, key=device_us, reverse=True)[:10]
    out = dict(
        count=count, wall_ms=1e3 * wall_s / count,
        cuda_kernel_ms=kernel_ms / count if cuda else None,
        gpu_busy_pct=100 * kernel_ms / (1e3 * wall_s) if cuda and wall_s
        else None,
        host_syncs=syncs,
        host_sync_ms=sum(s['host_ms'] for s in syncs.values()),
        scalar_reads=scalar / count,
        loader_wait_ms=loader / 1e3 / count,
        top_kernel_ops=[dict(op=e.key[:90], kernel_ms=device_us(e) / 1e3 /
                             count, calls=e.count / count) for e in top
                        if device_us(e) > 0])
    out.update(extra or {})
    return out


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
    config's or ``fused``; then one step counting its transfers between
    device and host by kind and call site."""
    from mmseg_stag.analysis.meters import HostTransfers
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
    if ctx.args.trace:
        prof.export_chrome_trace(osp.join(ctx.args.out_dir,
                                          'profile_step.json'))
    own = 'one device synchronisation per profile is the tool\'s own'
    return summarize_profile(prof, ctx.args.profile_steps, wall, ctx.cuda,
                             dict(note=own, optimizer=optimizer,
                                  transfers=transfers.counts(),
                                  transfer_sites=transfers.top_sites()))


def iteration_profiler(ctx, start, count):
    """An observing hook: profiles loop iterations ``start ..
    start + count - 1`` from the end of the one before (so the loader's
    fetch is inside), and times each loader wait (end of an iteration to
    the start of the next)."""
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
    from mmseg_stag.analysis.loop_benchmark import build_runner
    start, count = ctx.args.profile_warmup + 1, ctx.args.profile_iters
    args = loop_args(ctx, ['tent-stag'], start + count, 0)
    runner = build_runner(
        osp.join(REPO, NVLABS_CFG.format('tent-stag')), args,
        osp.join(ctx.tmp, 'profile'), 'tent-stag')
    hook = iteration_profiler(ctx, start, count)
    runner.register_hook(hook)
    runner.test()
    if ctx.args.trace:
        hook.prof.export_chrome_trace(osp.join(ctx.args.out_dir,
                                               'profile_loop.json'))
    waits = hook.waits[:count]
    return summarize_profile(hook.prof, count, hook.wall, ctx.cuda, dict(
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


def fmt(value, digits=1):
    return '–' if value is None else f'{value:,.{digits}f}'


def md_table(header, rows):
    """A Markdown table: the header, its rule, a line per row of cells."""
    def line(cells):
        return '| ' + ' | '.join(str(c) for c in cells) + ' |'

    return [line(header), '|' + '---|' * len(header)] + list(map(line, rows))


def markdown(report):
    """The report as Markdown: machine, steps, tests, each figure with its
    unit and settings."""
    env = report['environment']
    lines = ['# GPU check', '',
             f"{env['date']}; device: **{env.get('gpu') or 'CPU'}**"
             + (f" (compute capability {env['capability']}, "
                f"{env['gpu_memory_gib']} GiB, driver {env['driver']})"
                if env.get('gpu') else '')
             + f"; torch {env['torch']}, CUDA {env['cuda_runtime']}, cuDNN "
             f"{env['cudnn']}, mmengine {env['mmengine']}, mmcv "
             f"{env['mmcv']}, mmsegmentation {env['mmsegmentation']}; "
             f"{env['cpus']} CPU cores; `{report['command']}`.", '']
    if report['quick']:
        lines += ['**--allow-cpu --quick: a development run of the tool with '
                  'tiny sizes, not a measurement.**', '']
    lines += ['## Steps', ''] + md_table(
        ('step', 'status', 'time (s)'),
        [(s['name'], s['status'] + (f": {s['error']}" if 'error' in s
                                    else ''), s['seconds'])
         for s in report['steps']])
    lines += ['', f"Total {report['total_minutes']:.1f} min (budget "
              f"{report['budget_minutes']:g} min)"
              + (' — **over budget**' if report['over_budget'] else '')
              + ('' if report.get('finished') else ' — **the run had not '
                 'finished when this was written** (a step still running, '
                 'or the run was stopped): what it measured so far')
              + '.', '']
    # a step stopped part-way shows what it measured
    steps = {s['name']: s for s in report['steps'] if s.get('result')}
    for name, writer in (('tests', md_tests), ('step_cost', md_step_cost),
                         ('loader', md_loader), ('loop', md_loop),
                         ('profile', md_profile)):
        if name in steps:
            lines += writer(steps[name]['result']) + ['']
    return '\n'.join(lines)


def md_tests(r):
    out = ['## CUDA tests', '', f"`{r['command']}`: **{r.get('passed', 0)} "
           f"passed, {r.get('failed', 0)} failed, {r.get('errors', 0)} "
           f"errors, {r.get('skipped', 0)} skipped** (" + (
               'stopped at its time limit: the rest did not run'
               if r['returncode'] is None else
               f"exit status {r['returncode']}") + f"; log `{r['log']}`)."]
    out += [f'- skipped ({n}): {reason}'
            for reason, n in r.get('skip_reasons', {}).items()]
    out += [f"- {f['kind']}: `{f['test']}`: {f['message']}"
            for f in r.get('failures', [])]
    out += [f"- `{p['test']}`: {p['name']} = {p['value']}"
            for p in r.get('properties', [])]
    return out


def share_cells(row):
    pr = row['stag_pair_ratio']
    return (row['model'], row['method'], row['precision'], row['pairs'],
            f"{row['stag_time_share_pct']:+.2f}",
            f"{pr['median']:.4f} ({pr['min']:.4f}–{pr['max']:.4f})",
            f"{row['stag_term_ms']:.2f} ({row['stag_term_share_pct']:.2f} %)",
            ', '.join(f'{k} {v:.2f}' for k, v in
                      row['stag_term_variants_ms'].items()
                      if k != 'analytic'),
            f"{row['stag_memory_share_pct']:+.3f}")


def md_step_cost(r):
    out = ['## Step cost: each baseline vs +STAG', '',
           'Median whole-step time over interleaved pairs (CUDA events, '
           'nothing timed inside a step); memory: one step of each arm '
           'alone on the device (its model, optimizer state and input '
           'included), `max_memory_allocated` / `max_memory_reserved`.', '']
    out += md_table(
        ('model', 'precision', 'arm', 'step (ms)', 'fastest (ms)',
         'images/s', 'peak allocated (MB)', 'peak reserved (MB)',
         'step increase (MB)'),
        [(row['model'], row['precision'], label, fmt(a['step_ms'], 2),
          fmt(a['fastest_ms'], 2), fmt(a['images_per_s'], 1),
          fmt(a.get('peak_allocated_mb', a.get('peak_rss_mb'))),
          fmt(a.get('peak_reserved_mb')), fmt(a['step_increase_mb']))
         for row in r['rows'] for label, a in row['arms'].items()])
    out += [''] + md_table(
        ('model', 'baseline', 'precision', 'pairs', 'STAG time share (%)',
         'per-pair ratio (median, min–max)',
         'STAG term alone (ms, % of the baseline step)',
         'the term through autograd / compiled (ms)',
         'STAG memory share (%)'),
        map(share_cells, r['rows']))
    out.append('')
    for (model, kind), settings in {
            (row['model'], row['method']): row['settings']
            for row in r['rows']}.items():
        out.append(f'- {model}, {kind}: {settings}.')
    out.append('- cotta: the ACDC config\'s teacher on 14 views (ratios '
               '0.5–2.0, each flipped), the source model on the main view; '
               'cotta_fast: the same with `restore_on_device=True` and '
               '`batch_views=True` (7 teacher passes); hybrid_tta: the sides '
               'rounded up to multiples of its 32-px mask patches, as its '
               'authors run 960x544; MiT sdpa: '
               '`model.backbone.attention=sdpa`, sdpa-views: and '
               '`model.backbone.token_maps=view`.')
    out.append('- fp32: TF32 off for matmuls and cuDNN; tf32: on for both; '
               'bf16: `torch.autocast(bfloat16)` around the forward passes, '
               'TF32 off. Paper (Table efficiency, ImageNet, 50,000 images): '
               'TENT+STAG +0.2 % time, +0.13 % memory.')
    return out


def md_loader(r):
    images = r['images']
    return ['## Loader', '', f"{images['count']} generated "
            f"{images['size'][0]}x{images['size'][1]} {images['format']}, "
            f"{images['mean_mb']:.2f} MB per image on average; "
            f"{r['pipeline']}.", ''] + md_table(
        ('workers', 'images', 'start-up (s)', 'images/s'),
        [(row['workers'], row['images'], f"{row['startup_s']:.2f}",
          fmt(row['images_per_s'])) for row in r['rows']])


def md_loop(r):
    return ['## Whole loop', '', f"{r['settings']}; {r['images']} images "
            f"per method, timed after the first {r['warmup']}.", ''] + \
        md_table(('method', 'images/s', 'classifier calls / image'),
                 [(method, fmt(row['images_per_second'], 2),
                   fmt(row['classifier_calls_per_image'], 1))
                  for method, row in r['methods'].items()])


def profile_cells(name, per, p):
    calls = sum(s['calls'] for s in p['host_syncs'].values())
    return (name, per, fmt(p['wall_ms'], 2), fmt(p['cuda_kernel_ms'], 2),
            fmt(p['gpu_busy_pct']), f'{calls:.1f}',
            fmt(p['host_sync_ms'], 2), f"{p['scalar_reads']:.1f}",
            fmt(p.get('loader_wait_wall_ms', p['loader_wait_ms']), 2))


def md_profile(r):
    out = ['## Profile (torch.profiler)', '', f"{r['model']}, "
           f"{r['settings']}, TENT+STAG; the step alone in fp32 with TF32 "
           'off, the loop with the config as it is (float32, PyTorch\'s '
           'TF32 defaults).', '']
    out += md_table(
        ('what', 'per', 'wall (ms)', 'CUDA kernels (ms)', 'GPU busy (%)',
         'host sync calls', 'host sync (ms)', 'scalar reads',
         'loader wait (ms)'),
        [profile_cells('step alone', 'step', r['step'])]
        + ([profile_cells('step alone, fused Adam', 'step',
                          r['step_fused'])] if 'step_fused' in r else [])
        + [profile_cells('loop', 'iteration', r['loop'])])
    out += ['', 'Host sync calls: ' + ', '.join(SYNC_EVENTS) + '; scalar '
            f'reads: `{SCALAR_READ}` (`.item()`, `float(t)`, of a device or '
            'a CPU tensor). Loader wait: from the end of an iteration to the '
            'start of the next. Operators with the most kernel time, per '
            'step alone:', '']
    out += [f"- `{op['op']}`: {op['kernel_ms']:.2f} ms "
            f"({op['calls']:.0f} calls)" for op in r['step']['top_kernel_ops']]
    out += ['', 'What one step moves between device and host '
            '(`HostTransfers`: device_read waits for the GPU, host_read reads '
            'a CPU tensor, to_device / to_host are copies), by call site:',
            '']
    for label, key in (('config\'s Adam', 'step'),
                       ('fused Adam', 'step_fused')):
        if key in r:
            counts = ', '.join(f'{k} {v}' for k, v in
                               sorted(r[key]['transfers'].items())) or 'none'
            out.append(f'- {label}: {counts}')
            out += [f'  - {kind} × {n}: `{site}`'
                    for kind, site, n in r[key]['transfer_sites']]
    return out


def write_report(report, out_dir):
    """``gpu_check.{json,md}``: after every step and step-cost row, and at
    the end (``finished``)."""
    os.makedirs(out_dir, exist_ok=True)
    base = osp.join(out_dir, 'gpu_check')
    total = (time.perf_counter() - report['_t0']) / 60
    report.update(total_minutes=total,
                  over_budget=total > report['budget_minutes'])
    public = {k: v for k, v in report.items() if not k.startswith('_')}
    with open(base + '.json', 'w') as f:
        json.dump(public, f, indent=1)
    with open(base + '.md', 'w') as f:
        f.write(markdown(public) + '\n')
    return base


# ------------------------------------------------------------------ main
def main(argv=None):
    args = parse_args(argv)
    import torch
    device = 'cuda' if torch.cuda.is_available() else 'cpu'
    if device == 'cpu' and not args.allow_cpu:
        print(no_gpu_message(), file=sys.stderr)
        return 2
    os.makedirs(args.out_dir, exist_ok=True)
    report = dict(_t0=time.perf_counter(), command=' '.join(
        ['python', 'tools/gpu_check.py'] + list(argv if argv is not None
                                                else sys.argv[1:])),
        quick=bool(args.quick), environment=environment(device),
        budget_minutes=args.budget, finished=False, steps=[])
    print(f"[gpu_check] {report['environment']}", flush=True)
    ctx = Context(args, device)
    ctx.t0 = report['_t0']
    try:
        if 'tests' in args.only:
            run_step('tests', run_tests, ctx, report)
        for name in STEPS[1:]:
            if name in args.only:
                run_step(name, MEASURES[name], ctx, report)
    finally:
        ctx.close()
    report['finished'] = True
    base = write_report(report, args.out_dir)
    total = report['total_minutes']
    failed = [s['name'] for s in report['steps'] if s['status'] != 'ok']
    tests = next((s for s in report['steps'] if s['name'] == 'tests'), None)
    if tests and tests['status'] == 'ok' and \
            not tests['result']['passed_all']:
        failed.append('tests (failures)')
    print(f'\n[gpu_check] wrote {base}.md and {base}.json in {total:.1f} min'
          + (f' (over the {args.budget:g} min budget)'
             if report['over_budget'] else '')
          + (f"; FAILED: {', '.join(failed)}" if failed else '; all ok'))
    return 1 if failed else 0


if __name__ == '__main__':
    sys.exit(main())
