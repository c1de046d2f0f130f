"""Images per second of the whole online loop (data loading, adaptation,
post-processing, metric), per method, against TENT's two-forward loop as
CoTTA's ACDC code runs it (docs/benchmark.md).

    python tools/benchmark_loop.py CHECKPOINT --data-root data/acdc
        [--config-pattern PATTERN (a config with {} for the method)]
        [--methods tent tent-stag cotta two-forward] [--images 200]
        [--warmup 10] [--cfg-options k=v ...] [--out loop.json]

Each method's config runs through MMEngine's ``Runner`` on the first
``--images`` images, timed after ``--warmup``; ``two-forward`` is TENT
predicting under no_grad, then forwarding again for the loss (CoTTA's
``single_gpu_tent``). It prints images/s, the classifier calls per image
and the ratios to ``two-forward``, and writes JSON. The runs:
:mod:`benchmarks.loop_benchmark`.
"""
import argparse
import json
import os
import os.path as osp
import platform
import sys
import tempfile

REPO = osp.dirname(osp.dirname(osp.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

PATTERN = ('configs/stag_acdc/'
           'segformer_mit-b5-nvlabs_acdc-continual_{}.py')


def parse_args(argv=None):
    from mmengine.config import DictAction
    parser = argparse.ArgumentParser(
        description='images/s of the online loop, per method')
    parser.add_argument('checkpoint')
    parser.add_argument('--data-root', required=True,
                        help='the ACDC-layout stream')
    parser.add_argument('--config-pattern', default=PATTERN,
                        help='config path with {} for the method')
    parser.add_argument('--methods', nargs='+', default=[
        'tent', 'tent-stag', 'cotta', 'two-forward'])
    parser.add_argument('--images', type=int, default=200)
    parser.add_argument('--warmup', type=int, default=10)
    parser.add_argument('--cfg-options', nargs='+', action=DictAction,
                        default={}, metavar='KEY=VALUE',
                        help='settings of every method\'s config')
    parser.add_argument('--out', default='work_dirs/benchmark_loop.json')
    args = parser.parse_args(argv)
    if not 0 <= args.warmup < args.images:
        parser.error('need 0 <= --warmup < --images')
    if not osp.isfile(args.checkpoint):
        parser.error(f'checkpoint file not found: {args.checkpoint}')
    if not osp.isdir(args.data_root):
        parser.error(f'--data-root is not a folder: {args.data_root}')
    # the paths checked first, before the seconds of importing torch,
    # MMEngine and MMSeg
    from benchmarks.loop_benchmark import method_config

    # the configs relative to the repository
    args.config_pattern = osp.join(REPO, args.config_pattern)
    for method in args.methods:
        config = method_config(args.config_pattern, method)
        if not osp.isfile(config):
            parser.error(f'no config for {method!r}: {config}')
    return args


def main(argv=None):
    args = parse_args(argv)
    import torch

    from benchmarks.loop_benchmark import run_method
    results = {}
    with tempfile.TemporaryDirectory() as work_root:
        for method in args.methods:
            results[method] = run_method(method, args, work_root)
    machine = dict(platform=platform.platform(), cpus=os.cpu_count(),
                   torch=torch.__version__, threads=torch.get_num_threads(),
                   gpu=torch.cuda.get_device_name(0)
                   if torch.cuda.is_available() else None)
    reference = results.get('two-forward', {}).get('images_per_second')
    print(f'machine: {machine}')
    print(f"{'method':<14}{'images/s':>10}{'calls/img':>11}"
          f"{'vs two-fwd':>12}{'mIoU':>8}")
    for method, res in results.items():
        ips = res['images_per_second']
        ratio = ips / reference if reference and ips else None
        res['ratio_to_two_forward'] = ratio
        calls = res['classifier_calls_per_image']  # None: a graph run
        print(f"{method:<14}{ips:>10.3f}"
              f"{'-' if calls is None else f'{calls:.1f}':>11}"
              f"{'' if ratio is None else f'{ratio:.3f}':>12}"
              f"{res['mIoU'] or float('nan'):>8.2f}")
    if osp.dirname(args.out):
        os.makedirs(osp.dirname(args.out), exist_ok=True)
    with open(args.out, 'w') as f:
        json.dump(dict(machine=machine, images=args.images,
                       warmup=args.warmup, methods=results), f, indent=1)
    print(f'wrote {args.out}')


if __name__ == '__main__':
    main()
