"""The table of several runs of either task, side by side per stage and
condition (the paper's corruption layout: ``classification.
corruption_table``)."""
import os.path as osp
from collections import OrderedDict
from typing import Dict, List, Sequence, Tuple

from .report import (RESULTS_FILE, markdown_lines, mean_ignoring_nan,
                     new_figure, read_partial, read_results, write_files)


def read_run_stages(work_dir: str) -> Tuple[List[dict], bool]:
    """Return ``(stages, finished)`` of a run from its result files."""
    if osp.isfile(osp.join(work_dir, RESULTS_FILE)):
        return read_results(work_dir)['stages'], True
    return read_partial(work_dir), False


def _conditions(runs: Sequence[dict]) -> List[str]:
    return list(OrderedDict.fromkeys(
        s['condition'] for r in runs for s in r['stages']))


def _score(runs: Sequence[dict]) -> str:
    stages = [s for r in runs for s in r['stages']]
    return stages[0]['score_name'] if stages else 'mIoU'


def comparison_rows(runs: Sequence[dict]) -> List[dict]:
    """Return one flat row per run: its fields, means and stage scores."""
    conditions, score = _conditions(runs), _score(runs)
    rows = []
    for run in runs:
        stages = run['stages']
        row = {k: v for k, v in run.items() if k != 'stages'}
        row['stages_done'] = len(stages)
        row[f'{score}_mean_over_stages'] = mean_ignoring_nan(
            [s['score'] for s in stages]) if stages else None
        for c in conditions:
            values = [s['score'] for s in stages if s['condition'] == c]
            row[f'mean {c}'] = mean_ignoring_nan(values) if values else None
        for s in stages:
            row[f"r{s['round']} {s['condition']}"] = s['score']
        rows.append(row)
    return rows


def write_comparison(out_dir: str, runs: Sequence[dict],
                     prefix: str = 'comparison',
                     title: str = 'continual mIoU') -> Dict[str, str]:
    """Write the table and the figure of ``runs`` (each with ``name``,
    ``stages`` and other plain fields kept as columns) into ``out_dir``;
    return the paths keyed ``json``, ``csv``, ``md``, ``png``."""
    rows, conditions = comparison_rows(runs), _conditions(runs)
    columns = list(OrderedDict.fromkeys(k for row in rows for k in row))

    def cell(v):
        if v is None:
            return ''
        return f'{v:.2f}' if isinstance(v, float) else str(v)

    short = [c for c in ('name', 'status', 'stages_done',
                         f'{_score(runs)}_mean_over_stages')
             if c in columns] + [f'mean {c}' for c in conditions]
    md = markdown_lines(short, [[cell(row.get(c)) or '-' for c in short]
                                for row in rows])
    paths = write_files(out_dir, prefix, dict(runs=rows), [columns] + [
        [cell(row.get(c)) for c in columns] for row in rows], '\n'.join(md))
    plot_comparison(paths['png'], runs, conditions, title)
    return paths


def short_labels(names: Sequence[str]) -> List[str]:
    """Return the comma-separated parts of each name not all runs share."""
    parts = [name.split(',') for name in names]
    common = set.intersection(*map(set, parts)) if len(parts) > 1 else set()
    return [','.join(p for p in ps if p not in common) or name
            for ps, name in zip(parts, names)]


def plot_comparison(path: str, runs: Sequence[dict],
                    conditions: Sequence[str], title: str) -> None:
    """Plot one panel per condition, the score against the round per run."""
    from matplotlib.ticker import MaxNLocator
    n = max(len(conditions), 1)
    score = _score(runs)
    labels = short_labels([run['name'] for run in runs])
    ncol = min(len(runs), 3) or 1
    legend_rows = -(-len(runs) // ncol)
    height = 3.0 + 0.25 * legend_rows
    fig = new_figure(3.2 * n, height)
    axes = [fig.add_subplot(1, n, i + 1) for i in range(n)]
    for ax, condition in zip(axes, conditions):
        for run, label in zip(runs, labels):
            pts = sorted((s['round'], s['score']) for s in run['stages']
                         if s['condition'] == condition)
            if pts:
                ax.plot(*zip(*pts), marker='o', markersize=3, label=label)
        ax.set_title(condition)
        ax.set_xlabel('round')
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.ticklabel_format(axis='y', useOffset=False, style='plain')
        ax.grid(alpha=.3)
    axes[0].set_ylabel(f'{score} (%)')
    handles, names = axes[0].get_legend_handles_labels()
    if handles:
        fig.legend(handles, names, loc='lower center', ncol=ncol,
                   fontsize='small', frameon=False)
    fig.suptitle(title)
    fig.tight_layout(rect=(0, 0.25 * legend_rows / height + 0.02, 1, 1))
    fig.savefig(path, dpi=120)
