"""The paper's corruption table of classification runs: a column per
corruption, Avg. and Gain (accuracy or error %), as text, JSON, CSV, PNG."""
import math
from typing import Dict, List, Optional, Sequence

from mmseg_stag.engine.report import new_figure, read_results, write_files

#: what a corruption table can show: accuracy or error (%)
METRIC_WORDS = dict(acc='accuracy', err='error')
TABLE_METRICS = tuple(METRIC_WORDS)


def read_corruption_row(work_dir: str, name: str,
                        base: Optional[str] = None) -> dict:
    """Read the row ``name`` of a classification run (``base``: the
    baseline row of a +STAG row), with ``per_corruption``, ``avg_acc`` and
    ``avg_err`` (the tables' Avg.); FileNotFoundError if the run did not
    finish, ValueError if it is no classification run."""
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
    avg_of = {r['name']: r[f'avg_{metric}'] for r in rows}
    out = []
    for r in rows:
        values = [r['per_corruption'][c][metric] if c in r['per_corruption']
                  else None for c in corruptions]
        avg, base, gain = r[f'avg_{metric}'], r.get('base'), None
        if base in avg_of:
            diff = avg - avg_of[base]
            gain = diff if metric == 'acc' else -diff
        out.append(dict(name=r['name'], base=base, values=values, avg=avg,
                        gain=gain))
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
    header = [f'{title} ({METRIC_WORDS[metric]} %)'.strip()] + [
        (labels or {}).get(c, c) for c in corruptions] + ['Avg.', 'Gain']
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
                           meta: Optional[dict] = None,
                           labels: Optional[Dict[str, str]] = None
                           ) -> Dict[str, str]:
    """Write :func:`format_corruption_table`'s table and its JSON, CSV,
    PNG; return their paths keyed ``json``, ``csv``, ``txt``, ``png``."""
    vals = table_values(rows, corruptions, metric)
    cells = [['method'] + list(corruptions) + [f'avg_{metric}', 'gain']] + [
        [r['name']] + [_fmt(v) for v in r['values']] +
        [f'{r["avg"]:.2f}', '' if r['gain'] is None else f'{r["gain"]:+.2f}']
        for r in vals]
    record = dict(meta=meta or {}, metric=metric,
                  corruptions=list(corruptions), rows=list(rows), table=vals)
    paths = write_files(out_dir, stem, record, cells,
                        format_corruption_table(rows, corruptions, metric,
                                                title, labels), 'txt')
    plot_corruptions(paths['png'], vals, [(labels or {}).get(c, c)
                                          for c in corruptions], metric, title)
    return paths


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
    ax.set_ylabel(f'{METRIC_WORDS[metric]} (%)')
    ax.set_title(title)
    ax.grid(alpha=.3)
    fig.legend(*ax.get_legend_handles_labels(), loc='lower center',
               ncol=min(len(vals), 5) or 1, fontsize='x-small',
               frameon=False)
    fig.tight_layout(rect=(0, 0.1 + 0.04 * (len(vals) // 5), 1, 1))
    fig.savefig(path, dpi=120)
