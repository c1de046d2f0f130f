"""Figure running curves: cumulative online accuracy per batch over one
corruption stream, each baseline with and without STAG, one panel per
(architecture, baseline). Reads finished runs; runs nothing.

    python tools/analysis/running_curves.py \\
        --panel "CNN-BN, TENT" TENT=work_dirs/demo_cls/mild_bn/tent \\
            TENT+STAG=work_dirs/demo_cls/mild_bn/tent-stag \\
        --panel "CNN-GN, TENT" TENT=work_dirs/demo_cls/mild_gn/tent \\
            TENT+STAG=work_dirs/demo_cls/mild_gn/tent-stag \\
        [--corruption gaussian_noise] [--out work_dirs/analysis]

Each ``LABEL=WORK_DIR`` is a classification run of ``tools/test.py``
(its ``per_image.csv``). Writes ``running_curves.png`` and the curves as
``running_curves.{json,csv}``.
"""
import argparse
import math
import os.path as osp
import sys

from mmseg_stag.analysis import read_per_image, running_accuracy

# benchmarks/ (what these commands share) is the repository's, not an
# installed package's: the repository's root on the path
REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

from benchmarks.rows import pyplot, save_figure, write_numbers  # noqa: E402

NAME = 'running_curves'


def parse_args(argv=None):
    p = argparse.ArgumentParser(description='cumulative online accuracy '
                                'per batch (Figure running curves)')
    p.add_argument('--panel', nargs='+', action='append', required=True,
                   metavar='TITLE LABEL=WORK_DIR',
                   help='a panel: its title, then its runs (each the '
                   'folder of its results: the work dir, or its --out)')
    p.add_argument('--corruption', default=None,
                   help='the corruption whose stream is plotted (default: '
                   'each run\'s first)')
    p.add_argument('--file-prefix', default='', help='the metric\'s '
                   'file prefix (a run with several metrics writes '
                   'PREFIX_per_image.csv for each but the first)')
    p.add_argument('--out', default='work_dirs/analysis')
    args = p.parse_args(argv)
    panels = []
    for panel in args.panel:
        title, runs = panel[0], []
        if len(panel) < 2:
            p.error(f'--panel {title!r} has no LABEL=WORK_DIR')
        for item in panel[1:]:
            label, sep, work_dir = item.partition('=')
            if not sep or not label or not work_dir:
                p.error(f'--panel {title!r}: expected LABEL=WORK_DIR, got '
                        f'{item!r}')
            runs.append((label, work_dir))
        panels.append((title, runs))
    args.panels = panels
    return args


def plot(path, curves, corruption_note):
    n = len(curves)
    cols = min(3, n)
    rows = math.ceil(n / cols)
    fig, axes = pyplot().subplots(rows, cols, squeeze=False,
                                  figsize=(4.6 * cols, 3.4 * rows))
    for ax, (title, runs) in zip(axes.flat, curves.items()):
        for i, (label, c) in enumerate(runs.items()):
            ax.plot(c['batch'], c['accuracy'], label=label, color=f'C{i}',
                    linestyle='-' if '+STAG' not in label else '--')
        corruption = next(iter(runs.values()))['corruption']
        ax.set_title(f'{title} ({corruption})', fontsize=10)
        ax.set_xlabel('batch')
        ax.set_ylabel('cumulative accuracy (%)')
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    for ax in list(axes.flat)[n:]:
        ax.axis('off')
    fig.suptitle(f'Online accuracy running curves{corruption_note}',
                 fontsize=11)
    save_figure(fig, path)


def main(argv=None):
    args = parse_args(argv)
    curves = {}
    for title, runs in args.panels:
        curves[title] = {}
        for label, work_dir in runs:
            c = curves[title][label] = running_accuracy(
                read_per_image(work_dir, args.file_prefix), args.corruption)
            print(f'{title} / {label}: {c["corruption"]}, {len(c["batch"])} '
                  f'batches, final {c["accuracy"][-1]:.2f} %')
    base = write_numbers(
        args.out, NAME, dict(panels=curves, sources={
            t: dict(runs) for t, runs in args.panels}),
        ['panel', 'run', 'corruption', 'batch', 'images',
         'cumulative_accuracy'],
        [[title, label, c['corruption'], *point]
         for title, runs in curves.items() for label, c in runs.items()
         for point in zip(c['batch'], c['images'], c['accuracy'])])
    plot(base + '.png', curves,
         f' ({args.corruption})' if args.corruption else '')
    print(f'wrote {base}.png, .json, .csv')
    return curves


if __name__ == '__main__':
    main()
