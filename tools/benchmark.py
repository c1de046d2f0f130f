"""Benchmark: what STAG adds to a TTA step, and what predict-then-adapt saves.

For each SegFormer variant and each baseline (TENT, BN Adapt) it runs, in
one process and interleaved after a warm-up (A, B, A, B, ...), one TTA step
of the baseline and one of the baseline + STAG, each on its own copy of the
model and the same input, and measures per step:

* wall time;
* peak memory above the step's starting point: CPU RSS sampled every 0.5 ms
  by a thread (CUDA: ``torch.cuda.max_memory_allocated``);
* forward passes (decode-head calls) and backward passes
  (``torch.autograd.backward`` calls).

It also times our TENT step against a reference loop written the way
CoTTA's code does it: a no-grad forward for the prediction, then a second
forward with gradients for the loss.

    python tools/benchmark.py [--models b0 b5 b5-nvlabs] [--size 960 540]
        [--steps 5] [--warmup 2] [--out benchmark.json]

Prints medians, the +STAG/baseline ratio with its spread (min-max of the
per-pair ratios) and writes JSON. Random weights: timing does not depend on
them.
"""
import argparse
import copy
import json
import os
import os.path as osp
import platform
import statistics
import threading
import time

import torch

REPO = osp.dirname(osp.dirname(osp.abspath(__file__)))
MODEL_CONFIGS = {
    'b0': ('configs/stag_acdc/segformer_mit-b5_acdc-continual_tent.py',
           dict(embed_dims=32, num_layers=[2, 2, 2, 2]), [32, 64, 160, 256]),
    'b5': ('configs/stag_acdc/segformer_mit-b5_acdc-continual_tent.py', {},
           None),
    'b5-nvlabs': (
        'configs/stag_acdc/segformer_mit-b5-nvlabs_acdc-continual_tent.py',
        {}, None),
}
STAG = {'tent': dict(beta0=500.0, gamma=35.0),
        'bn_adapt': dict(beta0=250.0, gamma=25.0)}


def build_model(name, seed=0):
    from mmengine.config import Config
    from mmengine.registry import init_default_scope
    from mmseg.registry import MODELS
    config, backbone, in_channels = MODEL_CONFIGS[name]
    cfg = Config.fromfile(osp.join(REPO, config))
    cfg.model.backbone.update(backbone)
    if in_channels:
        cfg.model.decode_head.in_channels = in_channels
    init_default_scope('mmseg')
    torch.manual_seed(seed)
    return MODELS.build(cfg.model).eval()


def release_freed_memory():
    """Return freed heap pages to the OS so that RSS growth during the next
    step measures that step (glibc keeps freed memory otherwise)."""
    try:
        import ctypes
        ctypes.CDLL('libc.so.6').malloc_trim(0)
    except (OSError, AttributeError):
        pass


def rss_bytes():
    with open('/proc/self/statm') as f:
        return int(f.read().split()[1]) * os.sysconf('SC_PAGE_SIZE')


class PeakMemory:
    """Peak memory above the starting point while the block runs."""

    def __enter__(self):
        self.cuda = torch.cuda.is_available()
        if self.cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self.start = torch.cuda.memory_allocated()
            return self
        release_freed_memory()
        self.start = self.peak = rss_bytes()
        self._running = True
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self):
        while self._running:
            self.peak = max(self.peak, rss_bytes())
            time.sleep(0.0005)

    def __exit__(self, *exc):
        if self.cuda:
            torch.cuda.synchronize()
            self.peak = torch.cuda.max_memory_allocated()
        else:
            self._running = False
            self._thread.join()
            self.peak = max(self.peak, rss_bytes())
        self.delta_mb = (self.peak - self.start) / 2**20


class PassCounter:
    """Counts decode-head forwards and autograd backward calls."""

    def __init__(self, model):
        self.forwards = self.backwards = 0
        head_forward = model.decode_head.forward

        def counted(*args, **kwargs):
            self.forwards += 1
            return head_forward(*args, **kwargs)

        model.decode_head.forward = counted

    def __enter__(self):
        self._backward = torch.autograd.backward

        def counted(*args, **kwargs):
            self.backwards += 1
            return self._backward(*args, **kwargs)

        torch.autograd.backward = counted
        return self

    def __exit__(self, *exc):
        torch.autograd.backward = self._backward


def make_method(kind, model, stag):
    from mmseg_stag.registry import build_tta_method
    method = build_tta_method(dict(type=kind, stag=stag))
    method.configure(model, model.classifier)
    return method


def ours_step(method, inputs, metas):
    return method.adapt(
        lambda m, x: m.inference_with_features(x, metas), inputs)


def two_forward_step(method, inputs, metas):
    """CoTTA-style: predict under no_grad, then forward again for the loss."""
    model = method.model
    method.set_modes(model)
    with torch.no_grad():
        prediction = model.inference(inputs, metas)
    with torch.enable_grad():
        _, head_outputs = model.inference_with_features(inputs, metas)
        loss, _ = method.objective(head_outputs)
        method.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        method.optimizer.step()
    return prediction


def measure(step, method, inputs, metas, counter):
    f0, b0 = counter.forwards, counter.backwards
    with PeakMemory() as mem:
        start = time.perf_counter()
        step(method, inputs, metas)
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        seconds = time.perf_counter() - start
    return dict(seconds=seconds, peak_mb=mem.delta_mb,
                forwards=counter.forwards - f0,
                backwards=counter.backwards - b0)


def interleave(arms, inputs, metas, steps, warmup):
    """``arms``: name -> (step function, method, counter). Runs warm-up
    steps, then ``steps`` rounds of every arm in turn."""
    records = {name: [] for name in arms}
    for i in range(warmup + steps):
        order = list(arms) if i % 2 == 0 else list(reversed(arms))
        for name in order:
            step, method, counter = arms[name]
            with counter:
                rec = measure(step, method, inputs, metas, counter)
            if i >= warmup:
                records[name].append(rec)
    return records


def summary(records):
    return {k: statistics.median(r[k] for r in records)
            for k in ('seconds', 'peak_mb', 'forwards', 'backwards')}


def ratio_stats(a, b, key):
    ratios = [y[key] / x[key] for x, y in zip(a, b) if x[key] > 0]
    if not ratios:
        return None
    return dict(median=statistics.median(ratios), min=min(ratios),
                max=max(ratios))


def run_model(name, args, device):
    width, height = args.size
    inputs = torch.randn(1, 3, height, width, device=device)
    metas = [dict(ori_shape=(height, width), img_shape=(height, width),
                  pad_shape=(height, width), padding_size=[0, 0, 0, 0])]
    base = build_model(name).to(device)
    results = {}
    for kind in args.methods:
        arms = {}
        for label, stag in ((kind, None), (f'{kind}+stag', STAG[kind])):
            model = copy.deepcopy(base)
            arms[label] = (ours_step, make_method(kind, model, stag),
                           PassCounter(model))
        if kind == 'tent' and not args.skip_reference:
            model = copy.deepcopy(base)
            arms['tent two-forward reference'] = (
                two_forward_step, make_method('tent', model, None),
                PassCounter(model))
        records = interleave(arms, inputs, metas, args.steps, args.warmup)
        res = {label: dict(summary(recs), steps=recs)
               for label, recs in records.items()}
        plus = f'{kind}+stag'
        res['stag_time_ratio'] = ratio_stats(records[kind], records[plus],
                                             'seconds')
        res['stag_memory_ratio'] = ratio_stats(records[kind], records[plus],
                                               'peak_mb')
        if 'tent two-forward reference' in records:
            res['speedup_vs_two_forward'] = ratio_stats(
                records['tent'], records['tent two-forward reference'],
                'seconds')
        results[kind] = res
        print_table(name, kind, res)
    return results


def print_table(name, kind, res):
    print(f'\n{name} {kind}')
    print(f"{'arm':32s} {'time s':>9s} {'peak MB':>9s} {'fwd':>4s} "
          f"{'bwd':>4s}")
    for label, r in res.items():
        if isinstance(r, dict) and 'seconds' in r:
            print(f"{label:32s} {r['seconds']:9.3f} {r['peak_mb']:9.1f} "
                  f"{r['forwards']:4.0f} {r['backwards']:4.0f}")
    for key in ('stag_time_ratio', 'stag_memory_ratio',
                'speedup_vs_two_forward'):
        r = res.get(key)
        if r:
            print(f'{key:32s} {r["median"]:.4f} (min {r["min"]:.4f}, '
                  f'max {r["max"]:.4f})')


def main():
    parser = argparse.ArgumentParser(
        description='Time and memory of TTA steps with and without STAG '
        '(interleaved, one process)')
    parser.add_argument('--models', nargs='+', default=['b0', 'b5'],
                        choices=sorted(MODEL_CONFIGS))
    parser.add_argument('--methods', nargs='+', default=['tent', 'bn_adapt'],
                        choices=sorted(STAG))
    parser.add_argument('--size', type=int, nargs=2, default=(960, 540),
                        metavar=('W', 'H'), help='input size (paper: 960 540)')
    parser.add_argument('--steps', type=int, default=5)
    parser.add_argument('--warmup', type=int, default=2)
    parser.add_argument('--threads', type=int, default=None)
    parser.add_argument('--skip-reference', action='store_true',
                        help='do not time the two-forward reference loop')
    parser.add_argument('--out', default='work_dirs/benchmark.json')
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    import mmseg_stag  # noqa: F401  (registries)
    device = 'cuda' if torch.cuda.is_available() else 'cpu'
    machine = dict(platform=platform.platform(), processor=platform.machine(),
                   cpus=os.cpu_count(), torch=torch.__version__,
                   threads=torch.get_num_threads(), device=device)
    print(f'machine: {machine}; input {args.size[0]}x{args.size[1]}, '
          f'{args.warmup} warm-up + {args.steps} measured steps per arm')
    results = dict(machine=machine, size=list(args.size), steps=args.steps,
                   models={name: run_model(name, args, device)
                           for name in args.models})
    if osp.dirname(args.out):
        os.makedirs(osp.dirname(args.out), exist_ok=True)
    with open(args.out, 'w') as f:
        json.dump(results, f, indent=1)
    print(f'\nwrote {args.out}')


if __name__ == '__main__':
    main()
