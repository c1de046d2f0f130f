"""Table efficiency: forward and backward passes (in images), wall time
and peak memory of whole online runs, per method with and without STAG,
over a fixed number of images, in the paper's layout.

    python tools/analysis/efficiency.py CHECKPOINT \\
        --row Source configs/cls/imagenet-c/imagenet-c_mild_resnet50-bn_source.py \\
        --row TENT configs/cls/imagenet-c/imagenet-c_mild_resnet50-bn_tent.py \\
        --row +STAG configs/cls/imagenet-c/imagenet-c_mild_resnet50-bn_tent-stag.py \\
        [--images 50000] [--condition gaussian_noise] \\
        [--work-dir work_dirs/analysis/efficiency] [--cfg-options ...]

Each row is a tools/test.py run on the first ``--images`` images of one
stage (the first corruption / ACDC condition, or ``--condition``). Its
step is timed by ``mmseg_stag.analysis.meters``' timer (CUDA events on a
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
import csv
import json
import os
import os.path as osp
import platform
import sys

REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

NAME = 'efficiency'


def parse_args(argv=None):
    from mmseg_stag.analysis.rows import check_rows, row_parser
    p = row_parser('passes, time and memory per method (Table efficiency)',
                   'work_dirs/analysis/efficiency')
    p.add_argument('--images', type=int, default=None,
                   help='images of the stage to run (default: all)')
    p.add_argument('--warmup', type=int, default=1,
                   help='untimed runs of each row before its timed run '
                   '(one-time costs: lazy initialisations, caches)')
    args = p.parse_args(argv)
    check_rows(p, args)
    if args.images is not None and args.images < 1:
        p.error('--images must be >= 1')
    return args


class Meter:
    """Counts, time and memory of one run: a forward pre-hook on the
    adapted network (images in), ``torch.autograd.backward`` wrapped
    (images of the batch whose graph it runs), the step timer and the
    peak-memory sampler (``mmseg_stag.analysis.meters``) around the test
    loop."""

    def __init__(self):
        self.forward_images = self.backward_images = self.backwards = 0
        self._last_grad_batch = 0

    def attach(self, module):
        import torch

        def count(_, args):
            n = int(args[0].shape[0])
            self.forward_images += n
            if torch.is_grad_enabled():
                self._last_grad_batch = n

        return module.register_forward_pre_hook(count)

    def __enter__(self):
        import torch

        from mmseg_stag.analysis.meters import PeakMemory, StepTimer
        self._backward = torch.autograd.backward

        def backward(*args, **kwargs):
            self.backwards += 1
            self.backward_images += self._last_grad_batch
            return self._backward(*args, **kwargs)

        torch.autograd.backward = backward
        self.memory, self.timer = PeakMemory(), StepTimer()
        self.memory.__enter__()
        self.timer.__enter__()
        return self

    def __exit__(self, *exc):
        import torch
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
    """An MMEngine hook that meters the test loop (observes only)."""
    from mmengine.hooks import Hook

    class EfficiencyMeter(Hook):
        priority = 'LOWEST'

        def before_test_epoch(self, runner):
            task = runner.test_loop.task  # the task the loop adapts with
            self.handle = meter.attach(task.adapted_module(runner.model))
            meter.__enter__()

        def after_test_epoch(self, runner, metrics=None):
            meter.__exit__(None, None, None)
            self.handle.remove()

    return EfficiencyMeter()


def run_row(config, args, work_dir):
    from mmseg_stag.analysis.rows import stage_config
    from mmseg_stag.engine.report import read_results
    from mmseg_stag.engine.runs import prepare_config, run_test
    cfg = stage_config(config, args.cfg_options, args.condition, args.images)
    cfg.test_cfg.save_state = False
    meter = Meter()
    run_test(prepare_config(cfg, work_dir), args.checkpoint,
             hooks=[meter_hook(meter)])
    results = read_results(work_dir)
    images = sum(s['num_images'] for s in results['stages'])
    return dict(forward=meter.forward_images,
                backward=meter.backward_images,
                backward_passes=meter.backwards, time_s=meter.seconds,
                memory_mb=meter.peak_mb, images=images)


def plot(path, table, device):
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    names = list(table)
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
    panels = (('forward', 'backward', 'passes (images)'),
              ('time_s', None, 'time (s)'), ('memory_mb', None,
                                             'peak memory (MB)'))
    for ax, (key, second, title) in zip(axes, panels):
        xs = range(len(names))
        if second:
            w = 0.4
            b1 = ax.bar([x - w / 2 for x in xs], [table[n][key] for n in names],
                        w, label='forward')
            b2 = ax.bar([x + w / 2 for x in xs],
                        [table[n][second] for n in names], w,
                        label='backward')
            ax.bar_label(b1, fontsize=7)
            ax.bar_label(b2, fontsize=7)
            ax.legend(fontsize=8)
        else:
            bars = ax.bar(xs, [table[n][key] for n in names],
                          color='C2' if key == 'time_s' else 'C3')
            ax.bar_label(bars, fmt='%.1f', fontsize=7)
        ax.set_xticks(list(xs), names, rotation=20, ha='right', fontsize=8)
        ax.set_title(title, fontsize=10)
    fig.suptitle(f'Efficiency per method ({device})', fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)


def main(argv=None):
    args = parse_args(argv)
    import torch

    import mmseg_stag  # noqa: F401  (registries)
    from mmseg_stag.analysis.rows import slug
    device = (torch.cuda.get_device_name(0) if torch.cuda.is_available()
              else f'CPU ({platform.machine()}, {os.cpu_count()} cores, '
              f'{torch.get_num_threads()} threads)')
    table = {}
    for name, config in args.row:
        for i in range(args.warmup):
            run_row(config, args, osp.join(args.work_dir, 'warmup',
                                           slug(name)))
        table[name] = run_row(config, args, osp.join(args.work_dir,
                                                     slug(name)))
        r = table[name]
        print(f'{name:10s} forward {r["forward"]:8d} backward '
              f'{r["backward"]:8d} time {r["time_s"]:9.2f} s memory '
              f'{r["memory_mb"]:9.1f} MB')
    os.makedirs(args.work_dir, exist_ok=True)
    base = osp.join(args.work_dir, NAME)
    lines = [f'Efficiency on {device}, '
             f'{next(iter(table.values()))["images"]} images',
             f'{"Method":12s}{"Forward":>10s}{"Backward":>10s}'
             f'{"Time (s)":>11s}{"Memory (MB)":>13s}']
    for name, r in table.items():
        backward = f'{r["backward"]:,d}' if r['backward'] else 'N/A'
        lines.append(f'{name:12s}{r["forward"]:10,d}{backward:>10}'
                     f'{r["time_s"]:11.2f}{r["memory_mb"]:13,.1f}')
    with open(base + '.txt', 'w') as f:
        f.write('\n'.join(lines) + '\n')
    with open(base + '.csv', 'w', newline='') as f:
        writer = csv.writer(f)
        writer.writerow(['method', 'forward', 'backward', 'backward_passes',
                         'time_s', 'memory_mb', 'images'])
        for name, r in table.items():
            writer.writerow([name, r['forward'], r['backward'],
                             r['backward_passes'], r['time_s'],
                             r['memory_mb'], r['images']])
    with open(base + '.json', 'w') as f:
        json.dump(dict(device=device, rows=table,
                       configs=dict(args.row)), f, indent=1)
    plot(base + '.png', table, device)
    print('\n'.join(lines))
    print(f'wrote {base}.txt, .csv, .json, .png')
    return table


if __name__ == '__main__':
    main()
