"""Benchmark: what STAG adds to an adaptation step, and what
predict-then-adapt saves (docs/benchmark.md).

For each model and baseline it runs, interleaved after a warm-up, steps of
the baseline and of the baseline + STAG (and TENT's two-forward reference)
on random weights, and prints and writes (``--out``, JSON) each arm's time,
peak memory, memory saved for backward and passes, and the per-pair
ratios of the whole steps (STAG's share). The models and arms are
:mod:`benchmarks.step_benchmark`, the meters
:mod:`benchmarks.meters`.

    python tools/benchmark.py [--models b0 b5 b5-nvlabs resnet50 vit-b16]
        [--methods tent bn_adapt cotta hybrid_tta ...] [--size 960 540]
        [--ori-size 1920 1080]
        [--cls-size 224] [--batch-size 64]
        [--steps 5] [--warmup 2] [--mixed-precision bf16|fp16]
        [--out benchmark.json]
"""
import argparse
import json
import os
import os.path as osp
import platform
import sys

import torch

REPO = osp.dirname(osp.dirname(osp.abspath(__file__)))
if REPO not in sys.path:  # benchmarks/: the repository's, not installed
    sys.path.insert(0, REPO)

from benchmarks.step_benchmark import (ACDC_SIZE, CIFAR_MODELS,
                                       IMAGENET_MODELS, SEG_MODELS, SEG_VIEWS,
                                       run_model, seg_views_cfg)

METHODS = ['tent', 'bn_adapt', 'eata', 'cotta', 'ecotta', 'hybrid_tta']
#: segmentation baselines run only when --methods names them: their steps
#: cost many of TENT's (CoTTA's 14 teacher views, Hybrid-TTA's 3 passes)
SEG_ON_REQUEST = ('cotta', 'hybrid_tta')
#: a MiT's first stage reduces its keys by an 8x8 convolution of the 1/4
#: map: each side of an input needs 32 px
MIT_MIN_SIDE = 32


def parse_args():
    parser = argparse.ArgumentParser(
        description='Time and memory of adaptation steps with and without '
        'STAG (interleaved, one process)')
    parser.add_argument('--models', nargs='+', default=['b0', 'b5'],
                        choices=sorted(SEG_MODELS) +
                        sorted(IMAGENET_MODELS) + sorted(CIFAR_MODELS))
    parser.add_argument('--methods', nargs='+', choices=METHODS,
                        help='baselines of each model that it has '
                        '(bn_adapt, hybrid_tta: segmentation; eata: '
                        'ImageNet; cotta: segmentation and the CIFAR '
                        'WideResNets; ecotta: the CIFAR WideResNets); '
                        "default: all, but segmentation's cotta and "
                        'hybrid_tta only when named')
    parser.add_argument('--size', type=int, nargs=2, default=(960, 540),
                        metavar=('W', 'H'), help='segmentation input size '
                        '(paper: 960 540)')
    parser.add_argument('--ori-size', type=int, nargs=2, default=ACDC_SIZE,
                        metavar=('W', 'H'), help="the segmentation batch's "
                        'ori_shape, where the full-size losses (TENT\'s '
                        "pseudo_ce_fullres, CoTTA's) are computed (ACDC: "
                        '1920 1080)')
    parser.add_argument('--cls-size', type=int, default=224,
                        help='classification input side (224)')
    parser.add_argument('--batch-size', type=int, default=64,
                        help='classification batch size (64, the mild '
                        'ImageNet-C protocol)')
    parser.add_argument('--steps', type=int, default=5)
    parser.add_argument('--warmup', type=int, default=2)
    parser.add_argument('--threads', type=int, default=None)
    parser.add_argument('--mixed-precision', choices=['bf16', 'fp16'],
                        help='run every arm\'s step under torch.autocast '
                        'with this dtype (the STAG term stays float32)')
    parser.add_argument('--skip-reference', action='store_true',
                        help='do not time the two-forward reference loop')
    parser.add_argument('--out', default='work_dirs/benchmark.json')
    args = parser.parse_args()
    args.named = args.methods is not None
    args.methods = args.methods or METHODS
    if seg_runs('hybrid_tta', args) and any(side % 32 for side in args.size):
        parser.error(f'--size {args.size[0]} {args.size[1]}: hybrid_tta masks'
                     ' 32-px patches, so both sides must be multiples of 32 '
                     '(its authors run 960 544)')
    if seg_runs('cotta', args):
        smallest = smallest_view(args.size)
        if min(smallest) < MIT_MIN_SIDE:
            parser.error(
                f'--size {args.size[0]} {args.size[1]}: segmentation CoTTA\'s '
                f'smallest teacher view ({SEG_VIEWS}) is {smallest[0]}x'
                f'{smallest[1]}, below the {MIT_MIN_SIDE} px a MiT needs '
                'on each side')
    return args


def model_methods(name, args):
    """``--methods`` for the model ``name``: a segmentor's default skips
    ``SEG_ON_REQUEST``."""
    if name in SEG_MODELS and not args.named:
        return [m for m in args.methods if m not in SEG_ON_REQUEST]
    return args.methods


def seg_runs(method, args):
    """Whether a segmentation model of ``--models`` runs ``method``."""
    return any(name in SEG_MODELS and method in model_methods(name, args)
               for name in args.models)


def smallest_view(size):
    """``(w, h)`` of CoTTA's smallest teacher view of a ``size`` image."""
    ratios = seg_views_cfg(REPO)['ratios']
    return tuple(int(side * min(ratios)) for side in size)


def main():
    args = parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = 'cuda' if torch.cuda.is_available() else 'cpu'
    machine = dict(platform=platform.platform(), processor=platform.machine(),
                   cpus=os.cpu_count(), torch=torch.__version__,
                   threads=torch.get_num_threads(), device=device,
                   gpu=torch.cuda.get_device_name(0)
                   if device == 'cuda' else None)
    print(f'machine: {machine}; segmentation input {args.size[0]}x'
          f'{args.size[1]}, classification {args.batch_size}x3x'
          f'{args.cls_size}x{args.cls_size}; {args.warmup} warm-up + '
          f'{args.steps} measured steps per arm')
    results = dict(machine=machine, size=list(args.size),
                   ori_size=list(args.ori_size),
                   cls_size=args.cls_size, batch_size=args.batch_size,
                   steps=args.steps, mixed_precision=args.mixed_precision,
                   models={name: run_model(name, argparse.Namespace(
                       **dict(vars(args), methods=model_methods(name, args))),
                       device, REPO) for name in args.models})
    if osp.dirname(args.out):
        os.makedirs(osp.dirname(args.out), exist_ok=True)
    with open(args.out, 'w') as f:
        json.dump(results, f, indent=1)
    print(f'\nwrote {args.out}')


if __name__ == '__main__':
    main()
