"""Several continual runs side by side: one table (CSV, JSON, Markdown) and
one figure (mIoU per condition across rounds, one line per run, like the
paper's Figure continual_graph). Used by ``tools/sweep.py`` and the demo."""
import csv
import json
import os
import os.path as osp
from collections import OrderedDict
from typing import Dict, List, Sequence, Tuple

from .continual_report import PARTIAL_FILE, _json_safe, mean_ignoring_nan

RESULTS_FILE = 'continual_results.json'


def read_run_stages(work_dir: str) -> Tuple[List[dict], bool]:
    """``(stages, finished)`` of one run's work dir: the final
    ``continual_results.json``, else the stages its partial file holds
    (a run that failed or was stopped), else none."""
    final = osp.join(work_dir, RESULTS_FILE)
    if osp.isfile(final):
        with open(final) as f:
            return json.load(f)['stages'], True
    stages = []
    partial = osp.join(work_dir, PARTIAL_FILE)
    if osp.isfile(partial):
        with open(partial) as f:
            for line in f:
                try:
                    stages.append(json.loads(line))
                except json.JSONDecodeError:  # a line cut by a crash
                    break
    return stages, False


def _stage_key(stage: dict) -> str:
    return f"r{stage['round']} {stage['condition']}"


def _conditions(runs: Sequence[dict]) -> List[str]:
    return list(OrderedDict.fromkeys(
        s['condition'] for r in runs for s in r['stages']))


def comparison_rows(runs: Sequence[dict]) -> List[dict]:
    """One flat row per run: its fields other than ``stages``, the number
    of stages done, the mean over them, the mean per condition and every
    stage's mIoU (``'r<round> <condition>'``)."""
    conditions = _conditions(runs)
    rows = []
    for run in runs:
        stages = run['stages']
        row = {k: v for k, v in run.items() if k != 'stages'}
        row['stages_done'] = len(stages)
        row['mean_mIoU'] = mean_ignoring_nan([s['mIoU'] for s in stages]) \
            if stages else None
        for c in conditions:
            values = [s['mIoU'] for s in stages if s['condition'] == c]
            row[f'mean {c}'] = mean_ignoring_nan(values) if values else None
        for s in stages:
            row[_stage_key(s)] = s['mIoU']
        rows.append(row)
    return rows


def write_comparison(out_dir: str, runs: Sequence[dict],
                     prefix: str = 'comparison',
                     title: str = 'continual mIoU') -> Dict[str, str]:
    """Write the table and the figure of ``runs``.

    Args:
        out_dir (str): folder (created if needed).
        runs (Sequence[dict]): each with ``name``, ``stages`` (stage
            results: ``round``, ``condition``, ``mIoU``) and any other
            plain fields (``status``, ``config``, ``seed``...), kept as
            columns.
        prefix (str): file name stem.
        title (str): figure title.

    Returns:
        dict: paths keyed ``json``, ``csv``, ``md``, ``png``.
    """
    os.makedirs(out_dir, exist_ok=True)
    paths = {ext: osp.join(out_dir, f'{prefix}.{ext}')
             for ext in ('json', 'csv', 'md', 'png')}
    rows = comparison_rows(runs)
    columns = list(OrderedDict.fromkeys(k for row in rows for k in row))
    with open(paths['json'], 'w') as f:
        json.dump(_json_safe(dict(runs=rows)), f, indent=1)

    def cell(v):
        if v is None:
            return ''
        return f'{v:.2f}' if isinstance(v, float) else str(v)

    with open(paths['csv'], 'w', newline='') as f:
        writer = csv.writer(f)
        writer.writerow(columns)
        for row in rows:
            writer.writerow([cell(row.get(c)) for c in columns])
    conditions = _conditions(runs)
    short = [c for c in ('name', 'status', 'stages_done', 'mean_mIoU')
             if c in columns] + [f'mean {c}' for c in conditions]
    with open(paths['md'], 'w') as f:
        f.write('| ' + ' | '.join(short) + ' |\n')
        f.write('|' + '---|' * len(short) + '\n')
        for row in rows:
            f.write('| ' + ' | '.join(
                cell(row.get(c)) or '-' for c in short) + ' |\n')
    plot_comparison(paths['png'], runs, conditions, title)
    return paths


def plot_comparison(path: str, runs: Sequence[dict],
                    conditions: Sequence[str], title: str) -> None:
    """One panel per condition: mIoU vs round, a line per run."""
    # an explicit Agg canvas: no pyplot, no global backend switch
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    n = max(len(conditions), 1)
    fig = Figure(figsize=(3.2 * n, 3.4))
    FigureCanvasAgg(fig)
    axes = [fig.add_subplot(1, n, i + 1) for i in range(n)]
    for ax, condition in zip(axes, conditions):
        for run in runs:
            pts = sorted((s['round'], s['mIoU']) for s in run['stages']
                         if s['condition'] == condition)
            if pts:
                ax.plot(*zip(*pts), marker='o', markersize=3,
                        label=run['name'])
        ax.set_title(condition)
        ax.set_xlabel('round')
        ax.grid(alpha=.3)
    axes[0].set_ylabel('mIoU (%)')
    handles, labels = axes[0].get_legend_handles_labels()
    if handles:
        fig.legend(handles, labels, loc='lower center',
                   ncol=min(len(labels), 4), fontsize='small')
    fig.suptitle(title)
    rows_of_legend = (len(labels) + 3) // 4 if handles else 0
    fig.tight_layout(rect=(0, 0.07 * rows_of_legend, 1, 1))
    fig.savefig(path, dpi=120)
