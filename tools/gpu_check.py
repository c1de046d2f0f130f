r"""GPU check: the CUDA tests and the GPU measurements, one command, one
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

``--loop-methods NAME[:IMAGES] ...`` picks the ``loop`` step's configs
(``configs/stag_acdc/segformer_mit-b5-nvlabs_acdc-continual_<NAME>.py``,
each with its own image count); a fast preset (``…_bf16-graph``,
``…_bf16``) is compared with its faithful config when both ran on the same
images. Issue 65's GPU run (docs/benchmark.md#gpu-check):

    python tools/gpu_check.py --only loop --images-per-condition 100 \
        --loop-methods tent-stag_bf16-graph:400 tent-stag:400 \
        tent_bf16-graph:400 tent:400 cotta_bf16-graph:40 cotta:40 \
        cotta-stag_bf16-graph:40 --out-dir $OUT/gpu_check
"""
import argparse
import gc
import multiprocessing
import os
import os.path as osp
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from concurrent.futures import ProcessPoolExecutor
from datetime import datetime, timezone

REPO = osp.dirname(osp.dirname(osp.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

from benchmarks import first_contact
from benchmarks.gpu_report import write_report
from benchmarks.gpu_steps import (CONDITIONS, LOOP_DEFAULT, MEASURES,
                                  MIT_MODES, NVLABS_CFG, PRECISIONS, QUICK_SEG,
                                  QUICK_SEG_CHANNELS, SEG_METHODS, free_memory,
                                  run_tests)

STEPS = ('tests', 'step_cost', 'loader', 'loop', 'profile')

#: what the default run should take (minutes): a 10-minute GPU slot
BUDGET_MIN = 9.0

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
    ('--test-workers', None, 1, 'pytest-xdist processes of the tests '
     'step, sharing the GPU (default: 8 where pytest-xdist imports, else 1, '
     'said in the report; 1: one process, without pytest-xdist)'),
    ('--cls-batch', 64, None, 'ResNet-50 batch size (paper: 64)'),
    ('--cls-size', 224, None, 'ResNet-50 input side (224)'),
    ('--images-per-condition', 16, 1, 'generated images per ACDC '
     'condition (4 conditions; x 4 at least the largest loop count)'),
    ('--loop-images', 48, 1, 'images of the whole-loop run per method '
     '(a --loop-methods NAME:IMAGES sets its own)'),
    ('--loop-warmup', 8, None, 'loop images before its timing starts'),
    ('--profile-steps', 3, 1, 'TENT+STAG steps profiled'),
    ('--profile-iters', 3, 1, 'loop iterations profiled'),
    ('--profile-warmup', 3, None, 'steps / loop iterations before '
     'profiling'),
)


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
                   default=['tent', 'tent_graph', 'cotta_graph',
                            'hybrid_tta'],
                   help="step_cost's SegFormer baselines (default: tent "
                   'tent_graph cotta_graph hybrid_tta; cotta, the authors\' '
                   'way, and cotta_fast, its device options eagerly, were '
                   'measured on the H100 on 2026-11-27; ResNet-50: TENT, '
                   'and tent_graph when named)')
    p.add_argument('--skip-resnet', action='store_true',
                   help="step_cost without the ResNet-50 rows (a rerun of "
                   'SegFormer rows alone)')
    for flag, default, _, text in COUNTS:
        p.add_argument(flag, type=int, default=default, help=text)
    p.add_argument('--seg-size', type=int, nargs=2, default=(960, 540),
                   metavar=('W', 'H'), help='SegFormer input (paper: 960 '
                   '540)')
    p.add_argument('--ori-size', type=int, nargs=2, default=(1920, 1080),
                   metavar=('W', 'H'), help="SegFormer batches' ori_shape, "
                   "where TENT's and CoTTA's full-size losses are computed "
                   '(ACDC: 1920 1080)')
    p.add_argument('--image-size', type=int, nargs=2, default=(1920, 1080),
                   metavar=('W', 'H'),
                   help='generated stream images (ACDC: 1920 1080)')
    p.add_argument('--workers', type=int, nargs='+', default=[2, 8],
                   help='loader worker counts to compare')
    p.add_argument('--loop-methods', nargs='+', metavar='NAME[:IMAGES]',
                   help="the loop step's runs, in order: NAME is the "
                   "config's method part (configs/stag_acdc/segformer_"
                   'mit-b5-nvlabs_acdc-continual_<NAME>.py: tent, '
                   'tent-stag_bf16-graph, cotta, ...), IMAGES its image '
                   'count (default --loop-images); a fast preset is '
                   'compared with its faithful config (NAME without '
                   '_bf16-graph / _bf16) when both ran on the same images '
                   '(default: ' + ' '.join(LOOP_DEFAULT) + ', and on CUDA '
                   'tent-stag_bf16-graph)')
    p.add_argument('--first-contact', action='store_true',
                   help='only the first-contact check: is the fast path '
                   'right? Each graph preset beside itself eager on the '
                   'real B5 (seeded random weights) and generated '
                   '--image-size frames, each arm in its own process, into '
                   'first_contact.{md,json} (docs/benchmark.md, "First '
                   'contact"; about 6 minutes on one H100)')
    p.add_argument('--first-contact-images', type=int, default=16,
                   help='images per condition (2 conditions) of the TENT '
                   'and BN Adapt arms (default: %(default)s)')
    p.add_argument('--first-contact-cotta-images', type=int, default=3,
                   help='images per condition of the CoTTA arms (default: '
                   '%(default)s)')
    p.add_argument('--first-contact-arms', nargs='+', metavar='ARM',
                   help='run these arms only, by their names in the report '
                   "(e.g. 'tent-stag graph' 'tent-stag eager'); default: "
                   'all')
    p.add_argument('--arm-timeout', type=float, default=150,
                   help='seconds before one first-contact arm is stopped '
                   '(default: %(default)s)')
    p.add_argument('--first-contact-budget', type=float, default=6.0,
                   help='minutes after which no first-contact arm starts '
                   '(default: %(default)s)')
    p.add_argument('--trace', action='store_true',
                   help='also write the profiles as Chrome traces')
    p.add_argument('--budget', '--budget-min', type=float,
                   default=BUDGET_MIN, help='minutes the whole check may '
                   'take: the tests get 40 %%, the step-cost pairs what is '
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
    if args.first_contact:
        check_first_contact_args(p, args)
    if args.loop_methods is not None:
        args.loop_methods = parse_loop_methods(p, args.loop_methods)
    if args.quick:
        make_quick(args)
    if 'loop' in args.only:
        check_loop_images(p, args)
    return args


def check_first_contact_args(p, args):
    """``p.error`` for counts below 1 (each stage needs its warm-up steps,
    a capture and a replay: 4 images) and an arm name not in the plan."""
    if args.first_contact_images < 4 or args.first_contact_cotta_images < 3:
        p.error('--first-contact-images must be >= 4 and '
                '--first-contact-cotta-images >= 3 (2 eager steps, a '
                'capture and a replay in the first stage)')
    if args.first_contact_arms:
        names = [a.name for a in first_contact.plan(4, 3)[0]]
        unknown = [a for a in args.first_contact_arms if a not in names]
        if unknown:
            p.error(f'--first-contact-arms: no arm {unknown}; the arms: '
                    + ', '.join(repr(n) for n in names))


#: a --loop-methods entry: the config's method part, its image count
LOOP_ENTRY = re.compile(r'([A-Za-z0-9][\w.-]*)(?::(\d+))?')


def loop_config(name):
    """The config of loop method ``name`` (``two-forward``: TENT's, as
    ``benchmarks.loop_benchmark.method_config`` has it), repository
    relative."""
    return NVLABS_CFG.format('tent' if name == 'two-forward' else name)


def parse_loop_methods(p, items):
    """``[(name, images or None)]`` of ``--loop-methods``, each name's
    config checked to exist before any work (``p.error`` names the
    missing config), each count > ``--loop-warmup``, no name twice."""
    plan = []
    for item in items:
        m = LOOP_ENTRY.fullmatch(item)
        if m is None:
            p.error(f'--loop-methods {item!r}: not NAME or NAME:IMAGES '
                    '(e.g. tent-stag_bf16-graph or cotta:40)')
        name, images = m.group(1), m.group(2)
        config = loop_config(name)
        if not osp.isfile(osp.join(REPO, config)):
            p.error(f'--loop-methods {item!r}: no config {config}')
        if name in [n for n, _ in plan]:
            p.error(f'--loop-methods names {name!r} twice')
        plan.append((name, None if images is None else int(images)))
    return plan


def check_loop_images(p, args):
    """Each loop run's images above ``--loop-warmup`` and within the
    generated stream (``--images-per-condition`` x 4 conditions): a run
    asking for more would run fewer images than it says, and a preset and
    its faithful config would not be compared on the same images. Refused
    (``p.error``), naming the count to pass, rather than the stream grown
    behind the option's back."""
    plan = args.loop_methods or [(name, None) for name in LOOP_DEFAULT]
    have = len(CONDITIONS) * args.images_per_condition
    for name, images in plan:
        asked = f'--loop-methods {name}:{images}' if images is not None \
            else f'--loop-images {args.loop_images}'
        images = images or args.loop_images
        if images <= args.loop_warmup:
            p.error(f'{asked}: need more images than --loop-warmup '
                    f'{args.loop_warmup}')
        if images > have:
            p.error(f'{asked} needs {images} images; the generated stream '
                    f'holds {have} (--images-per-condition '
                    f'{args.images_per_condition} x {len(CONDITIONS)} '
                    'conditions): pass --images-per-condition '
                    f'{-(-images // len(CONDITIONS))} or more')


def make_quick(args):
    """Tiny sizes and counts (``--quick``): the pipeline in seconds."""
    args.test_paths, args.test_workers = ['tests/cuda'], 1
    # CoTTA's smallest teacher view (ratio 0.5) needs 32 px a side
    args.seg_size, args.cls_batch, args.cls_size = (128, 64), 2, 32
    args.ori_size = (256, 128)  # the full-size losses' upsampling, small
    args.image_size, args.images_per_condition = (96, 48), 2
    # bf16 convolutions are ~25x slower than fp32 on a CPU without bf16
    # units, TF32 is a GPU flag: fp32 only (tests/tools cover the others)
    args.precisions, args.mit = ['fp32'], ['mmseg', 'sdpa-views']
    args.pairs = args.method_pairs = 1
    args.warmup, args.memory_warmup = 0, 0
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


def first_contact_refusal():
    import torch
    return ('gpu_check --first-contact needs a CUDA device, and '
            f'torch.cuda.is_available() is False here (torch '
            f'{torch.__version__}, built for CUDA {torch.version.cuda}), so '
            'nothing was run.')


def run_first_contact(args, device):
    """The first-contact check (:mod:`benchmarks.first_contact`): the
    generated frames and the random B5 made once, each arm in its own
    process, the comparisons; ``first_contact.{md,json}`` in
    ``--out-dir``. Exit status 0 when every comparison passed, 1
    otherwise."""
    import torch
    t0 = time.perf_counter()
    os.makedirs(args.out_dir, exist_ok=True)
    args.images_per_condition = max(args.first_contact_images,
                                    args.first_contact_cotta_images)
    ctx = Context(args, device)
    arms, comparisons = first_contact.plan(args.first_contact_images,
                                           args.first_contact_cotta_images)
    if args.first_contact_arms:
        arms = [a for a in arms if a.name in args.first_contact_arms]
        comparisons = [c for c in comparisons if c.graph in
                       args.first_contact_arms and c.eager in
                       args.first_contact_arms]
    from mmseg_stag.engine.provenance import code_version
    report = dict(command=' '.join(['python', 'tools/gpu_check.py'] +
                                   sys.argv[1:]),
                  environment=environment(device), code=code_version(),
                  stand_in=not ctx.cuda, tolerances=first_contact.TOLERANCES,
                  learning_rate=first_contact.CHECK_LR, passed=False,
                  minutes=0.0, arms={}, comparisons=[])

    def save(results):
        report.update(arms=results, minutes=(time.perf_counter() - t0) / 60)
        first_contact.write(report, args.out_dir)

    try:
        root = ctx.data_root(first_contact.CHECK_CONDITIONS)
        checkpoint = ctx.checkpoint()
        base = ctx.seg_options()

        def make_spec(arm):
            folder = osp.join(ctx.tmp, arm.name.replace(' ', '_').replace(
                ',', ''))
            os.makedirs(folder, exist_ok=True)
            return dict(config=osp.join(REPO, NVLABS_CFG.format(arm.config)),
                        options=repr(first_contact.arm_options(
                            arm, root, base, args.quick)),
                        checkpoint=checkpoint, work_dir=folder,
                        weights=osp.join(folder, 'weights.pt'),
                        stand_in=not ctx.cuda, repo=REPO)

        results = first_contact.run_arms(
            arms, make_spec, ctx.tmp, args.arm_timeout,
            t0 + 60 * args.first_contact_budget, save)
        source = torch.load(checkpoint, map_location='cpu')['state_dict']
        report['comparisons'] = [first_contact.compare(c, results, source)
                                 for c in comparisons]
        report['passed'] = first_contact.verdict(report['comparisons'])
        save(results)
    finally:
        ctx.close()
    base = osp.join(args.out_dir, 'first_contact')
    print(f"\n[first-contact] {'PASS' if report['passed'] else 'FAIL'} in "
          f"{report['minutes']:.1f} min: {base}.md, {base}.json")
    return 0 if report['passed'] else 1


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
        self.repo = REPO  # the configs and the tests the steps run
        self.t0 = time.perf_counter()  # the budget's start
        self.save_partial = lambda result: None  # run_step sets it
        self.tmp = tempfile.mkdtemp(prefix='gpu_check_')
        self._data_root = self._checkpoint = None
        self.generate_seconds = None  # the stream's, once generated

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

    def data_root(self, conditions=CONDITIONS):
        """The generated ACDC-layout stream (``--image-size`` PNGs) of
        ``conditions``, cut into chunks written by one process each (up to
        one per CPU core)."""
        if self._data_root is None:
            root = osp.join(self.tmp, 'acdc')
            t0 = time.perf_counter()
            jobs = generation_jobs(root, self.args.images_per_condition,
                                   tuple(self.args.image_size),
                                   os.cpu_count() or 1, conditions)
            context = multiprocessing.get_context('spawn')
            with ProcessPoolExecutor(min(len(jobs), os.cpu_count() or 1),
                                     mp_context=context) as pool:
                list(pool.map(generate_condition, jobs))
            self.generate_seconds = time.perf_counter() - t0
            print(f'[gpu_check] generated '
                  f'{len(conditions) * self.args.images_per_condition} '
                  f'{self.args.image_size[0]}x{self.args.image_size[1]} '
                  f'images in {self.generate_seconds:.1f} s ({len(jobs)} '
                  'processes)', flush=True)
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


def generation_jobs(root, count, size, processes, conditions=CONDITIONS):
    """The generated stream's jobs ``(root, condition, count, size, seed,
    start)``: each condition's ``count`` frames cut into chunks of an even
    size, about ``processes`` chunks in all (one per condition at least);
    a condition's first chunk has the seed one job per condition had."""
    per = max(1, processes // len(conditions))
    chunk = max(2, -(-count // per))
    chunk += chunk % 2  # even: a frame keeps its sequence folder
    return [(root, c, min(chunk, count - start), size,
             k if start == 0 else 1000 * (k + 1) + start, start)
            for k, c in enumerate(conditions)
            for start in range(0, count, chunk)]


def generate_condition(job):
    """One chunk of a condition of the generated stream (a worker
    process's job): frames ``start .. start + count - 1``, written apart
    and moved to their numbers in ``root``."""
    from demo_data import acdc_paths, make_acdc_like_tree
    root, condition, count, size, seed, start = job
    if start == 0:
        make_acdc_like_tree(root, conditions=(condition, ),
                            images_per_condition=count, size=size, seed=seed)
        return
    part = osp.join(root, f'.chunk_{condition}_{start}')
    make_acdc_like_tree(part, conditions=(condition, ),
                        images_per_condition=count, size=size, seed=seed)
    for i in range(count):  # start is even: i % 2 == (start + i) % 2
        sequence = f'GOPR0{400 + i % 2}'
        for src, dst in zip(
                acdc_paths(part, condition, 'train', sequence, i),
                acdc_paths(root, condition, 'train', sequence, start + i)):
            os.makedirs(osp.dirname(dst), exist_ok=True)
            os.replace(src, dst)
    shutil.rmtree(part)


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


# ------------------------------------------------------------------ main
def main(argv=None):
    args = parse_args(argv)
    import torch
    device = 'cuda' if torch.cuda.is_available() else 'cpu'
    if device == 'cpu' and not args.allow_cpu:
        print(first_contact_refusal() if args.first_contact
              else no_gpu_message(), file=sys.stderr)
        return 2
    if args.first_contact:
        return run_first_contact(args, device)
    os.makedirs(args.out_dir, exist_ok=True)
    # what the imports made is never garbage: the full collection before
    # each measured arm (free_memory) then skips it (53 collections took
    # 10 s of the --quick step cost on a 2-core CPU machine before)
    gc.freeze()
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
