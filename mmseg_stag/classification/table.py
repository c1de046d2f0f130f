"""Several classification runs as one table in the paper's layout."""
import csv
import json
import math
import os
import os.path as osp
from typing import Dict, List, Optional, Sequence

from mmseg_stag.engine.report import json_safe, read_results
from .data import SHORT_NAMES
from .metric import TABLE_METRICS


def read_run(work_dir: str, name: str, base: Optional[str] = None) -> dict:
    """Read one table row from a run's ``continual_results.json``.

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
                            metric: str = 'acc', title: str = '') -> str:
    """Format a plain-text table in the paper's layout."""
    vals = table_values(rows, corruptions, metric)
    header = [f'{title} ({"accuracy" if metric == "acc" else "error"} %)'
              .strip()] + [SHORT_NAMES.get(c, c) for c in corruptions] + \
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


def write_corruption_table(out_dir: str, rows: Sequence[dict],
                           corruptions: Sequence[str], metric: str = 'acc',
                           title: str = '', stem: str = 'table',
                           meta: Optional[dict] = None) -> Dict[str, str]:
    """Write the table as ``<stem>.json``, ``.csv``, ``.txt`` and ``.png``.

    Returns:
        dict[str, str]: Paths keyed ``json``, ``csv``, ``txt``, ``png``.
    """
    os.makedirs(out_dir, exist_ok=True)
    vals = table_values(rows, corruptions, metric)
    paths = {k: osp.join(out_dir, f'{stem}.{k}')
             for k in ('json', 'csv', 'txt', 'png')}
    with open(paths['json'], 'w', encoding='utf-8') as f:
        json.dump(json_safe(dict(meta=meta or {}, metric=metric,
                                 corruptions=list(corruptions),
                                 rows=list(rows), table=vals)), f, indent=1)
    with open(paths['csv'], 'w', newline='', encoding='utf-8') as f:
        writer = csv.writer(f)
        writer.writerow(['method'] + list(corruptions) +
                        [f'avg_{metric}', 'gain'])
        for r in vals:
            writer.writerow([r['name']] + [_fmt(v) for v in r['values']] +
                            [f'{r["avg"]:.2f}', '' if r['gain'] is None
                             else f'{r["gain"]:+.2f}'])
    with open(paths['txt'], 'w', encoding='utf-8') as f:
        f.write(format_corruption_table(rows, corruptions, metric, title) +
                '\n')
    plot_corruptions(paths['png'], vals, corruptions, metric, title)
    return paths


def plot_corruptions(path: str, vals: Sequence[dict],
                     corruptions: Sequence[str], metric: str,
                     title: str) -> None:
    """Plot the metric per corruption, one line per run."""
    # an explicit Agg canvas: no pyplot, no global backend switch
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    fig = Figure(figsize=(max(6, 0.5 * len(corruptions) + 2), 4.6))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    xs = list(range(len(corruptions)))
    for r in vals:
        ax.plot(xs, [float('nan') if v is None else v for v in r['values']],
                marker='o', markersize=3,
                label=f"{r['name']} ({_fmt(r['avg'])})")
    ax.set_xticks(xs)
    ax.set_xticklabels([SHORT_NAMES.get(c, c) for c in corruptions],
                       rotation=45, ha='right', fontsize='small')
    ax.set_ylabel(f'{"accuracy" if metric == "acc" else "error"} (%)')
    ax.set_title(title)
    ax.grid(alpha=.3)
    fig.legend(*ax.get_legend_handles_labels(), loc='lower center',
               ncol=min(len(vals), 5) or 1, fontsize='x-small',
               frameon=False)
    fig.tight_layout(rect=(0, 0.1 + 0.04 * (len(vals) // 5), 1, 1))
    fig.savefig(path, dpi=120)
