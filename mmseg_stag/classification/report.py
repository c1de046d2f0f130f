"""The paper's table layout and the JSON/CSV files of a run.

Rows are methods with and without STAG; columns the corruptions in stream
order, their average, and for a +STAG row the gain over its baseline
(accuracy: +STAG - base; error: base - +STAG, so a positive gain is an
improvement either way, as in the paper's parentheses).
"""
import csv
import json
import math
import os
import os.path as osp
from typing import Dict, List, Optional, Sequence, Union

from .data import SHORT_NAMES
from .runner import RowResult

METRICS = ('acc', 'err')


def _row_dict(row: Union[RowResult, dict]) -> dict:
    return row.to_dict() if isinstance(row, RowResult) else row


def table_values(rows: Sequence[Union[RowResult, dict]],
                 corruptions: Sequence[str],
                 metric: str = 'acc') -> List[dict]:
    """Per row: ``name``, ``values`` (per corruption, %), ``avg`` and
    ``gain`` (``None`` unless the row has a base row in ``rows``)."""
    if metric not in METRICS:
        raise ValueError(f'metric must be one of {METRICS}, got {metric!r}')
    rows = [_row_dict(r) for r in rows]
    out, avg_of = [], {}
    for r in rows:
        values = [r['per_corruption'][c][metric] for c in corruptions]
        avg = r['avg_acc'] if metric == 'acc' else r['avg_err']
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


def format_table(rows: Sequence[Union[RowResult, dict]],
                 corruptions: Sequence[str],
                 metric: str = 'acc',
                 title: str = '') -> str:
    """A plain-text table in the paper's layout."""
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


def write_results(work_dir: str,
                  rows: Sequence[Union[RowResult, dict]],
                  corruptions: Sequence[str],
                  metric: str = 'acc',
                  meta: Optional[Dict] = None,
                  stem: str = 'results',
                  title: str = '') -> Dict[str, str]:
    """Write ``<stem>.json`` (everything), ``<stem>.csv`` (the table) and
    ``<stem>.txt`` (the printed table) into ``work_dir``."""
    os.makedirs(work_dir, exist_ok=True)
    vals = table_values(rows, corruptions, metric)
    table = format_table(rows, corruptions, metric, title)
    paths = {k: osp.join(work_dir, f'{stem}.{k}')
             for k in ('json', 'csv', 'txt')}
    with open(paths['json'], 'w', encoding='utf-8') as f:
        json.dump(dict(meta=meta or {}, metric=metric,
                       corruptions=list(corruptions),
                       rows=[_row_dict(r) for r in rows], table=vals), f,
                  indent=2, default=str)
    with open(paths['csv'], 'w', newline='', encoding='utf-8') as f:
        writer = csv.writer(f)
        writer.writerow(['method'] + list(corruptions) +
                        [f'avg_{metric}', 'gain'])
        for r in vals:
            writer.writerow([r['name']] + [f'{v:.2f}' for v in r['values']]
                            + [f'{r["avg"]:.2f}',
                               '' if r['gain'] is None else
                               f'{r["gain"]:+.2f}'])
    with open(paths['txt'], 'w', encoding='utf-8') as f:
        f.write(table + '\n')
    return paths
