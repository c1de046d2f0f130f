"""Table efficiency: forward and backward passes (in images), wall time
and peak memory of whole online runs, per method with and without STAG,
over a fixed number of images, in the paper's layout.

    python tools/analysis/efficiency.py CHECKPOINT \\
        --row Source \\
            configs/cls/imagenet-c/imagenet-c_mild_resnet50-bn_source.py \\
        --row TENT \\
            configs/cls/imagenet-c/imagenet-c_mild_resnet50-bn_tent.py \\
        --row +STAG \\
            configs/cls/imagenet-c/imagenet-c_mild_resnet50-bn_tent-stag.py \\
        [--images 50000] [--condition gaussian_noise] \\
        [--work-dir work_dirs/analysis/efficiency] [--cfg-options ...]

Each row is a tools/test.py run on the first ``--images`` images of one
stage (the first corruption / ACDC condition, or ``--condition``). Its
step is timed by ``benchmarks.meters``' timer (CUDA events on a
GPU, wall time on the CPU, after ``--warmup`` untimed runs of the row) and
memory by its peak sampler (``max_memory_allocated`` on a GPU, the whole
run's peak: MMEngine's log processor resets that counter at every log
interval, and the sampler folds it into a running maximum before each
reset; on the CPU the peak RSS above the run's start). Forward counts every
image through the adapted network; Backward the images of every batch a
backward pass ran on (the paper's DeYO row counts the samples its filter
kept).
Writes ``efficiency.{txt,csv,json,png}`` with the device it ran on.
"""
import os
import os.path as osp
import platform
import sys

import torch
from mmengine.hooks import Hook

from mmseg_stag.engine.report import read_results

# benchmarks/ (what these commands share) is the repository's, not an
# installed package's: the repository's root on the path
REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

from benchmarks import meters
from benchmarks.rows import (parse_rows, pyplot, row_parser, run_stage,
                             save_figure, slug, write_numbers)

NAME = 'efficiency'
#: a row's numbers, in the CSV's order
COLUMNS = ('forward', 'backward', 'backward_passes', 'time_s', 'memory_mb',
           'images')


def parse_args(argv=None):
    p = row_parser('passes, time and memory per method (Table efficiency)',
                   'work_dirs/analysis/efficiency')
    p.add_argument('--images', type=int, default=None,
                   help='images of the stage to run (default: all)')
    p.add_argument('--warmup', type=int, default=1,
                   help='untimed runs of each row before its timed run '
                   '(one-time costs: lazy initialisations, caches)')
    args = parse_rows(p, argv)
    if args.images is not None and args.images < 1:
        p.error('--images must be >= 1')
    return args


class Meter:
    """Counts, time and memory of one run: a forward pre-hook on the
    adapted network (images in), ``torch.autograd.backward`` wrapped
    (images of the batch whose graph it runs: one Python call a backward
    pass, where ``meters.BackwardPasses``' saved-tensor hooks would add
    one per saved tensor to the timed run), the step timer and the
    peak-memory meter (``benchmarks.meters``) around the test
    loop."""

    def __init__(self):
        self.forward_images = self.backward_images = self.backwards = 0
        self._last_grad_batch = 0

    def attach(self, module):
        def count(_, args):
            n = int(args[0].shape[0])
            self.forward_images += n
            if torch.is_grad_enabled():
                self._last_grad_batch = n

        return module.register_forward_pre_hook(count)

    def __enter__(self):
        self._backward = torch.autograd.backward

        def backward(*args, **kwargs):
            self.backwards += 1
            self.backward_images += self._last_grad_batch
            return self._backward(*args, **kwargs)

        torch.autograd.backward = backward
        # looked up now: the tests replace meters.StepTimer
        self.memory, self.timer = meters.PeakMemory(), meters.StepTimer()
        self.memory.__enter__()
        self.timer.__enter__()
        return self

    def __exit__(self, *exc):
        self.timer.__exit__(*exc)
        self.memory.__exit__(*exc)
        torch.autograd.backward = self._backward
        self.seconds = self.timer.seconds
        # GPU: the peak allocated over the whole run (the paper's figure),
        # across the log processor's resets; CPU: the peak RSS above the
        # run's start (the process keeps earlier runs' memory)
        self.peak_mb = self.memory.peak / 2**20 if self.memory.cuda \
            else self.memory.delta_mb


def meter_hook(meter):
    """An MMEngine hook that meters the test loop (observes only); after
    each batch, before the logger (``LoggerHook``, 'BELOW_NORMAL'), it
    folds the GPU's peak memory, which the log processor resets."""
    class EfficiencyMeter(Hook):
        priority = 'NORMAL'

        def before_test_epoch(self, runner):
            task = runner.test_loop.task  # the task the loop adapts with
            self.handle = meter.attach(task.adapted_module(runner.model))
            meter.__enter__()

        def after_test_iter(self, runner, batch_idx, data_batch=None,
                            outputs=None):
            meters.fold_peak_memory()

        def after_test_epoch(self, runner, metrics=None):
            meter.__exit__(None, None, None)
            self.handle.remove()

    return EfficiencyMeter()


def run_row(config, args, work_dir):
    """One row's numbers (:data:`COLUMNS`)."""
    meter = Meter()
    run_stage(config, args, work_dir, meter_hook(meter))
    stages = read_results(work_dir)['stages']
    return dict(forward=meter.forward_images,
                backward=meter.backward_images,
                backward_passes=meter.backwards, time_s=meter.seconds,
                memory_mb=meter.peak_mb,
                images=sum(s['num_images'] for s in stages))


def plot(path, table, device):
    names = list(table)
    fig, axes = pyplot().subplots(1, 3, figsize=(13, 3.6))
    panels = (('forward', 'backward', 'passes (images)'),
              ('time_s', None, 'time (s)'), ('memory_mb', None,
                                             'peak memory (MB)'))
    for ax, (key, second, title) in zip(axes, panels):
        xs = range(len(names))
        if second:
            for shift, field in ((-0.2, key), (0.2, second)):
                bars = ax.bar([x + shift for x in xs],
                              [table[n][field] for n in names], 0.4,
                              label=field)
                ax.bar_label(bars, fontsize=7)
            ax.legend(fontsize=8)
        else:
            bars = ax.bar(xs, [table[n][key] for n in names],
                          color='C2' if key == 'time_s' else 'C3')
            ax.bar_label(bars, fmt='%.1f', fontsize=7)
        ax.set_xticks(list(xs), names, rotation=20, ha='right', fontsize=8)
        ax.set_title(title, fontsize=10)
    fig.suptitle(f'Efficiency per method ({device})', fontsize=10)
    save_figure(fig, path)


def main(argv=None):
    args = parse_args(argv)
    device = (torch.cuda.get_device_name(0) if torch.cuda.is_available()
              else f'CPU ({platform.machine()}, {os.cpu_count()} cores, '
              f'{torch.get_num_threads()} threads)')
    table = {}
    for name, config in args.row:
        for _ in range(args.warmup):
            run_row(config, args, osp.join(args.work_dir, 'warmup',
                                           slug(name)))
        r = table[name] = run_row(config, args,
                                  osp.join(args.work_dir, slug(name)))
        print(f'{name:10s} forward {r["forward"]:8d} backward '
              f'{r["backward"]:8d} time {r["time_s"]:9.2f} s memory '
              f'{r["memory_mb"]:9.1f} MB')
    lines = [f'Efficiency on {device}, '
             f'{next(iter(table.values()))["images"]} images',
             f'{"Method":12s}{"Forward":>10s}{"Backward":>10s}'
             f'{"Time (s)":>11s}{"Memory (MB)":>13s}']
    for name, r in table.items():
        backward = f'{r["backward"]:,d}' if r['backward'] else 'N/A'
        lines.append(f'{name:12s}{r["forward"]:10,d}{backward:>10}'
                     f'{r["time_s"]:11.2f}{r["memory_mb"]:13,.1f}')
    base = write_numbers(
        args.work_dir, NAME,
        dict(device=device, rows=table, configs=dict(args.row)),
        ['method', *COLUMNS],
        [[name, *(r[k] for k in COLUMNS)] for name, r in table.items()])
    with open(base + '.txt', 'w') as f:
        f.write('\n'.join(lines) + '\n')
    plot(base + '.png', table, device)
    print('\n'.join(lines))
    print(f'wrote {base}.txt, .csv, .json, .png')
    return table


if __name__ == '__main__':
    main()
