"""The tables of several runs of either task: side by side per stage and
condition, or the paper's layout (a column per corruption, Avg., Gain)."""
import csv
import json
import math
import os
import os.path as osp
from collections import OrderedDict
from typing import Dict, List, Optional, Sequence, Tuple

from .report import (RESULTS_FILE, json_safe, mean_ignoring_nan,
                     read_partial, read_results)

#: what a corruption table can show: accuracy or error (%)
TABLE_METRICS = ('acc', 'err')


def read_run_stages(work_dir: str) -> Tuple[List[dict], bool]:
    """Return ``(stages, finished)`` of a run from its result files."""
    if osp.isfile(osp.join(work_dir, RESULTS_FILE)):
        return read_results(work_dir)['stages'], True
    return read_partial(work_dir), False


def read_run(work_dir: str, name: str, base: Optional[str] = None) -> dict:
    """Read one corruption-table row from a classification run.

    Args:
        work_dir (str): The run's work dir.
        name (str): The row's name.
        base (str, optional): Name of the baseline row of a +STAG row.

    Returns:
        dict: The row, with ``per_corruption``, ``avg_acc`` and ``avg_err``
        (the mean over corruptions, the tables' Avg.).

    Raises:
        FileNotFoundError: If the run did not finish.
        ValueError: If it is not a classification run.
    """
    try:
        results = read_results(work_dir)
    except FileNotFoundError as err:
        raise FileNotFoundError(f'run {name!r}: {err}') from None
    if results['task'] != 'classification':
        raise ValueError(f'run {name!r} in {work_dir} is a '
                         f"{results['task']} run, not a classification one")
    details = results['details']
    acc = details['acc_mean_over_corruptions']
    return dict(name=name, base=base, work_dir=work_dir,
                per_corruption=details['per_corruption'], avg_acc=acc,
                avg_err=100.0 - acc, num_updates=results.get('num_updates'))


def _stage_key(stage: dict) -> str:
    return f"r{stage['round']} {stage['condition']}"


def _conditions(runs: Sequence[dict]) -> List[str]:
    return list(OrderedDict.fromkeys(
        s['condition'] for r in runs for s in r['stages']))


def _score(runs: Sequence[dict]) -> str:
    """The runs' score name (``score_name`` of their stages)."""
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
            row[_stage_key(s)] = s['score']
        rows.append(row)
    return rows


def table_values(rows: Sequence[dict], corruptions: Sequence[str],
                 metric: str = 'acc') -> List[dict]:
    """Return per row its ``name``, ``values``, ``avg`` and ``gain``."""
    if metric not in TABLE_METRICS:
        raise ValueError(f'metric must be one of {TABLE_METRICS}, got '
                         f'{metric!r}')
    out, avg_of = [], {}
    for r in rows:
        values = [r['per_corruption'][c][metric] if c in r['per_corruption']
                  else None for c in corruptions]
        avg = r[f'avg_{metric}']
        avg_of[r['name']] = avg
        out.append(dict(name=r['name'], base=r.get('base'), values=values,
                        avg=avg, gain=None))
    for r in out:
        if r['base'] in avg_of:
            diff = r['avg'] - avg_of[r['base']]
            r['gain'] = diff if metric == 'acc' else -diff
    return out


def _fmt(v: Optional[float], sign: bool = False) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return '-'
    return f'{v:+.2f}' if sign else f'{v:.1f}'


def format_corruption_table(rows: Sequence[dict],
                            corruptions: Sequence[str],
                            metric: str = 'acc', title: str = '',
                            labels: Optional[Dict[str, str]] = None) -> str:
    """Format a plain-text table in the paper's layout; ``labels`` maps a
    corruption to its column title (default: its name)."""
    vals = table_values(rows, corruptions, metric)
    header = [f'{title} ({"accuracy" if metric == "acc" else "error"} %)'
              .strip()] + [(labels or {}).get(c, c) for c in corruptions] + \
        ['Avg.', 'Gain']
    body = [[r['name']] + [_fmt(v) for v in r['values']] +
            [_fmt(r['avg']), _fmt(r['gain'], sign=True)] for r in vals]
    widths = [max(len(line[i]) for line in [header] + body)
              for i in range(len(header))]

    def line(cells):
        return '  '.join(c.ljust(widths[0]) if i == 0 else c.rjust(widths[i])
                         for i, c in enumerate(cells))

    rule = '-' * len(line(header))
    return '\n'.join([line(header), rule] + [line(b) for b in body])


def _write(out_dir: str, stem: str, text_ext: str, record: dict,
           cells: List[list], text: str) -> Dict[str, str]:
    """Write ``<stem>.json``, ``.csv`` and the text; return all paths."""
    os.makedirs(out_dir, exist_ok=True)
    paths = {k: osp.join(out_dir, f'{stem}.{k}')
             for k in ('json', 'csv', text_ext, 'png')}
    with open(paths['json'], 'w', encoding='utf-8') as f:
        json.dump(json_safe(record), f, indent=1)
    with open(paths['csv'], 'w', newline='', encoding='utf-8') as f:
        csv.writer(f).writerows(cells)
    with open(paths[text_ext], 'w', encoding='utf-8') as f:
        f.write(text + '\n')
    return paths


def write_comparison(out_dir: str, runs: Sequence[dict],
                     prefix: str = 'comparison',
                     title: str = 'continual mIoU') -> Dict[str, str]:
    """Write the table and the figure of ``runs``.

    Args:
        out_dir (str): Folder, created if needed.
        runs (Sequence[dict]): Each with ``name``, ``stages`` and other
            plain fields kept as columns.
        prefix (str): File name stem. Default: 'comparison'.
        title (str): Figure title. Default: 'continual mIoU'.

    Returns:
        dict[str, str]: Paths keyed ``json``, ``csv``, ``md``, ``png``.
    """
    rows, conditions = comparison_rows(runs), _conditions(runs)
    columns = list(OrderedDict.fromkeys(k for row in rows for k in row))

    def cell(v):
        if v is None:
            return ''
        return f'{v:.2f}' if isinstance(v, float) else str(v)

    short = [c for c in ('name', 'status', 'stages_done',
                         f'{_score(runs)}_mean_over_stages')
             if c in columns] + [f'mean {c}' for c in conditions]
    md = ['| ' + ' | '.join(short) + ' |', '|' + '---|' * len(short)] + [
        '| ' + ' | '.join(cell(row.get(c)) or '-' for c in short) + ' |'
        for row in rows]
    paths = _write(out_dir, prefix, 'md', dict(runs=rows), [columns] + [
        [cell(row.get(c)) for c in columns] for row in rows], '\n'.join(md))
    plot_comparison(paths['png'], runs, conditions, title)
    return paths


def write_corruption_table(out_dir: str, rows: Sequence[dict],
                           corruptions: Sequence[str], metric: str = 'acc',
                           title: str = '', stem: str = 'table',
                           meta: Optional[dict] = None,
                           labels: Optional[Dict[str, str]] = None
                           ) -> Dict[str, str]:
    """Write :func:`format_corruption_table`'s table and its JSON, CSV, PNG.

    Returns:
        dict[str, str]: Paths keyed ``json``, ``csv``, ``txt``, ``png``.
    """
    vals = table_values(rows, corruptions, metric)
    cells = [['method'] + list(corruptions) + [f'avg_{metric}', 'gain']] + [
        [r['name']] + [_fmt(v) for v in r['values']] +
        [f'{r["avg"]:.2f}', '' if r['gain'] is None else f'{r["gain"]:+.2f}']
        for r in vals]
    record = dict(meta=meta or {}, metric=metric,
                  corruptions=list(corruptions), rows=list(rows), table=vals)
    paths = _write(out_dir, stem, 'txt', record, cells,
                   format_corruption_table(rows, corruptions, metric, title,
                                           labels))
    plot_corruptions(paths['png'], vals, [(labels or {}).get(c, c)
                                          for c in corruptions], metric, title)
    return paths


def short_labels(names: Sequence[str]) -> List[str]:
    """Return the comma-separated parts of each name not all runs share."""
    parts = [name.split(',') for name in names]
    common = set.intersection(*map(set, parts)) if len(parts) > 1 else set()
    return [','.join(p for p in ps if p not in common) or name
            for ps, name in zip(parts, names)]


def new_figure(width: float, height: float):
    """Return a Matplotlib figure on its own canvas."""
    # an explicit Agg canvas: no pyplot, no global backend switch
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    fig = Figure(figsize=(width, height))
    FigureCanvasAgg(fig)
    return fig


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


def plot_corruptions(path: str, vals: Sequence[dict],
                     titles: Sequence[str], metric: str, title: str) -> None:
    """Plot the metric per corruption (``titles``), one line per run."""
    fig = new_figure(max(6, 0.5 * len(titles) + 2), 4.6)
    ax = fig.add_subplot(1, 1, 1)
    xs = list(range(len(titles)))
    for r in vals:
        ax.plot(xs, [float('nan') if v is None else v for v in r['values']],
                marker='o', markersize=3,
                label=f"{r['name']} ({_fmt(r['avg'])})")
    ax.set_xticks(xs)
    ax.set_xticklabels(titles, rotation=45, ha='right', fontsize='small')
    ax.set_ylabel(f'{"accuracy" if metric == "acc" else "error"} (%)')
    ax.set_title(title)
    ax.grid(alpha=.3)
    fig.legend(*ax.get_legend_handles_labels(), loc='lower center',
               ncol=min(len(vals), 5) or 1, fontsize='x-small',
               frameon=False)
    fig.tight_layout(rect=(0, 0.1 + 0.04 * (len(vals) // 5), 1, 1))
    fig.savefig(path, dpi=120)
