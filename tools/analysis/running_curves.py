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
import csv
import math
import os
import os.path as osp
import sys
from typing import Dict, List, Optional

from mmseg_stag.classification.metric import PER_IMAGE_FILE
from mmseg_stag.engine.report import result_file

# benchmarks/ (what these commands share) is the repository's, not an
# installed package's: the repository's root on the path
REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

from benchmarks.rows import pyplot, save_figure, write_numbers

NAME = 'running_curves'


def read_per_image(results_dir: str,
                   file_prefix: str = '') -> List[Dict[str, object]]:
    """A finished run's ``per_image.csv``, the images in stream order.

    Args:
        results_dir (str): Where the run's metric wrote its files: its
            ``output_dir`` (``tools/test.py --out``), by default the run's
            work dir.
        file_prefix (str): The metric's ``file_prefix`` (a run with
            several metrics: each but the first writes ``PREFIX_...``).
            Default: '' (the plain name).
    """
    name = result_file(PER_IMAGE_FILE[:-len('.csv')], file_prefix) + '.csv'
    path = osp.join(results_dir, name)
    if not osp.isfile(path):
        others = sorted(n for n in os.listdir(results_dir)
                        if n.endswith('_' + PER_IMAGE_FILE)) \
            if osp.isdir(results_dir) else []
        raise FileNotFoundError(
            f'{results_dir}: no {name}, so not the results of a finished '
            'classification run (tools/test.py writes it at the end of a '
            'stream, in the metric\'s output_dir: the work dir, or --out)'
            + (f'; it holds {", ".join(others)}: give the metric\'s '
               'file prefix' if others else ''))
    with open(path, newline='') as f:
        rows = [dict(r) for r in csv.DictReader(f)]
    for r in rows:
        for key in ('image', 'batch', 'stage', 'round', 'correct'):
            r[key] = int(r[key])
    if not rows:
        raise ValueError(f'{path} holds no image')
    return rows


def running_accuracy(rows: List[dict], corruption: Optional[str] = None
                     ) -> Dict[str, list]:
    """The accuracy (%) after each batch of one corruption (default: the
    first): ``corruption`` and per batch ``batch``, ``images``,
    ``accuracy``."""
    if corruption is None:
        corruption = rows[0]['corruption']
    mine = [r for r in rows if r['corruption'] == corruption]
    if not mine:
        seen = sorted({r['corruption'] for r in rows})
        raise ValueError(f'no image of corruption {corruption!r} (the run '
                         f'has {seen})')
    images, accuracy, correct = [], [], 0
    for i, r in enumerate(mine):
        correct += r['correct']
        if i + 1 == len(mine) or mine[i + 1]['batch'] != r['batch']:
            images.append(i + 1)
            accuracy.append(100.0 * correct / (i + 1))
    return dict(corruption=corruption, batch=list(range(1, len(images) + 1)),
                images=images, accuracy=accuracy)


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
