"""Result table and files (JSON, CSV, PNG, partial JSONL) of an online run,
one record for both tasks (docs/running.md), and the writers every result
file of the package goes through (:func:`write_files`, :func:`write_json`,
:func:`append_partial`, :func:`write_torch`, :func:`new_figure`).

A run's first ``StreamMetric`` writes the plain names (``RESULTS_FILE``,
``PARTIAL_FILE``, ...); each other one the same names behind its ``prefix``
and ``_`` (:func:`result_file`), so two metrics of a run keep both files.
"""
import csv
import json
import math
import os
import os.path as osp
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

import numpy as np

PARTIAL_FILE = 'continual_results.partial.jsonl'
RESULTS_FILE = 'continual_results.json'
#: the version of the record above; a file of another is refused
RESULTS_SCHEMA = 2


def result_file(name: str, prefix: str = '') -> str:
    """Return the name of the result file ``name`` of a metric whose files
    start with ``prefix`` (``''``: a run's first metric, the plain name)."""
    return f'{prefix}_{name}' if prefix else name


def mean_ignoring_nan(values: Sequence[float]) -> float:
    """Return the mean ignoring NaN and None (NaN if nothing is left)."""
    values = [v for v in values if v is not None and not math.isnan(v)]
    return float(np.mean(values)) if values else float('nan')


def json_safe(value):
    """Return ``value`` with NaN replaced by None, recursively."""
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


def write_json(path: str, obj) -> str:
    """Write ``obj`` as indented UTF-8 JSON (NaN as null); return ``path``."""
    with open(path, 'w', encoding='utf-8') as f:
        json.dump(json_safe(obj), f, indent=1)
    return path


def write_files(out_dir: str, stem: str, record: Optional[dict] = None,
                cells: Optional[Iterable[Sequence]] = None,
                text: Optional[str] = None, text_ext: str = 'md'
                ) -> Dict[str, str]:
    """Write ``<stem>.json`` (``record``), ``<stem>.csv`` (``cells``, rows
    of cells) and ``<stem>.<text_ext>`` (``text``), those given, in
    ``out_dir`` (made if needed); return the paths keyed ``json``, ``csv``,
    ``text_ext`` and ``png`` (for the caller's figure)."""
    os.makedirs(out_dir, exist_ok=True)
    paths = {k: osp.join(out_dir, f'{stem}.{k}')
             for k in ('json', 'csv', text_ext, 'png')}
    if record is not None:
        write_json(paths['json'], record)
    if cells is not None:
        with open(paths['csv'], 'w', newline='', encoding='utf-8') as f:
            csv.writer(f).writerows(cells)
    if text is not None:
        with open(paths[text_ext], 'w', encoding='utf-8') as f:
            f.write(text + '\n')
    return paths


def write_torch(path: str, obj) -> str:
    """Write ``obj`` with ``torch.save`` atomically (a temporary file,
    flushed to disk, then renamed: a crash leaves the old file or the new),
    making its folder if needed; return ``path``."""
    import torch  # here: the JSON and CSV readers need no torch
    os.makedirs(osp.dirname(osp.abspath(path)), exist_ok=True)
    tmp = f'{path}.tmp.{os.getpid()}'
    with open(tmp, 'wb') as f:
        torch.save(obj, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return path


def new_figure(width: float, height: float):
    """Return a Matplotlib figure on its own canvas."""
    # an explicit Agg canvas: no pyplot, no global backend switch
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    fig = Figure(figsize=(width, height))
    FigureCanvasAgg(fig)
    return fig


def markdown_lines(header: Sequence, rows: Iterable[Sequence]) -> List[str]:
    """The lines of a Markdown table: ``header``, its rule and a line per
    row of cells."""
    def line(cells):
        return '| ' + ' | '.join(str(c) for c in cells) + ' |'

    return [line(header), '|' + '---|' * len(header)] + list(map(line, rows))


def format_stage_table(stages: List[dict], conditions: Sequence[str]) -> str:
    """Format the paper's round-by-condition table of stage results, with
    row and column means; ``conditions`` give the column order."""
    rounds = sorted({s['round'] for s in stages})
    name = stages[0]['score_name'] if stages else ''

    def fmt(v):
        return '     -' if v is None else f'{v:6.1f}'

    lines = ['Round | ' + ' | '.join(f'{c:>6}' for c in conditions) +
             ' |   Mean']
    for r in rounds:
        row = {s['condition']: s['score'] for s in stages
               if s['round'] == r}
        vals = [row.get(c) for c in conditions]
        lines.append(f'{r:>5} | ' + ' | '.join(fmt(v) for v in vals) +
                     f' | {fmt(mean_ignoring_nan(vals))}')
    col_means = [
        mean_ignoring_nan([s['score'] for s in stages
                           if s['condition'] == c])
        for c in conditions
    ]
    mean = mean_ignoring_nan([s['score'] for s in stages])
    lines.append(' Mean | ' + ' | '.join(fmt(v) for v in col_means) +
                 f' | {fmt(mean)}')
    lines.append(f'mean over {len(stages)} stages: {mean:.1f} {name}')
    return '\n'.join(lines)


def append_partial(output_dir: str, result: dict, fresh: bool = False,
                   prefix: str = '') -> str:
    """Append one finished stage to ``continual_results.partial.jsonl`` in
    ``output_dir`` (made if needed; ``fresh``: start the file afresh;
    ``prefix``: see :func:`result_file`); return its path."""
    os.makedirs(output_dir, exist_ok=True)
    path = osp.join(output_dir, result_file(PARTIAL_FILE, prefix))
    with open(path, 'w' if fresh else 'a') as f:
        f.write(json.dumps(json_safe(result)) + '\n')
    return path


def read_partial(output_dir: str, prefix: str = '') -> List[dict]:
    """Return the stages of the partial file (of the metric of ``prefix``:
    :func:`result_file`), up to a cut line."""
    stages = []
    path = osp.join(output_dir, result_file(PARTIAL_FILE, prefix))
    if osp.isfile(path):
        with open(path) as f:
            for line in f:
                try:
                    stages.append(json.loads(line))
                except json.JSONDecodeError:
                    break
    return stages


def results_record(task: str, stages: List[dict], conditions: Sequence[str],
                   details: Optional[dict] = None, **run_info) -> dict:
    """Return the run's record (docs/running.md), without writing it;
    ``run_info``: facts of the run (``num_updates``)."""
    return dict(schema=RESULTS_SCHEMA, task=task,
                score_name=stages[0]['score_name'], stages=stages,
                mean_over_stages=mean_ignoring_nan(
                    [s['score'] for s in stages]),
                conditions=list(conditions),
                rounds=max(s['round'] for s in stages), **run_info,
                details=details or {})


def read_results(work_dir: str, prefix: str = '') -> dict:
    """Return the record of a finished run's ``continual_results.json``
    (of the metric of ``prefix``: :func:`result_file`;
    ``FileNotFoundError`` if the run did not finish, ``ValueError`` if the
    file is of another schema)."""
    path = osp.join(work_dir, result_file(RESULTS_FILE, prefix))
    if not osp.isfile(path):
        raise FileNotFoundError(f'no {path} (the run did not finish)')
    with open(path) as f:
        record = json.load(f)
    if record.get('schema') != RESULTS_SCHEMA:
        raise ValueError(f'{path} has results schema '
                         f"{record.get('schema', 1)}, this mmseg_stag reads "
                         f'{RESULTS_SCHEMA}: run it again (or read it with '
                         'the version that wrote it)')
    return record


def write_results(output_dir: str, record: dict,
                  detail: Optional[Tuple[str, Sequence[str]]] = None,
                  prefix: str = '') -> Dict[str, str]:
    """Write the JSON, CSV and PNG results of an online run's ``record``
    into ``output_dir`` (made if needed), ``detail``: ``(key, columns)`` of
    a dict in each stage's ``details`` written as CSV columns, ``prefix``:
    see :func:`result_file`; return the paths keyed ``json``, ``csv``,
    ``png``."""
    score = record['score_name']
    stages, conditions = record['stages'], record['conditions']

    def cell(v):
        return '' if v is None or math.isnan(v) else f'{v:.2f}'

    key, columns = detail or (None, [])
    # the realistic protocol's runs: how many of a stage's images adapted
    adapted = ['images_adapted'] if 'images_adapted' in stages[0] else []
    cells = [['stage', 'round', 'condition', score] + list(columns) +
             ['num_images'] + adapted] + [
        [s['stage'], s['round'], s['condition'], cell(s['score'])] +
        [cell(s['details'][key].get(c)) for c in columns] +
        [s['num_images']] + [s[k] for k in adapted]
        for s in stages]
    written = write_files(
        output_dir, result_file(RESULTS_FILE[:-len('.json')], prefix),
        record, cells)
    paths = dict(json=written['json'], csv=written['csv'],
                 png=osp.join(output_dir, result_file(
                     f'continual_{score.lower()}.png', prefix)))
    plot_stages(paths['png'], stages, conditions, score,
                record['mean_over_stages'])
    return paths


def plot_stages(path: str, stages: List[dict], conditions: Sequence[str],
                score: str, mean: float) -> None:
    """Plot the score per condition against the round."""
    fig = new_figure(6, 3.5)
    ax = fig.add_subplot(1, 1, 1)
    if len({s['round'] for s in stages}) == 1:
        # one pass (a classification stream): the score per stage, in order
        ax.plot(range(len(stages)), [s['score'] for s in stages],
                marker='o')
        ax.set_xticks(range(len(stages)))
        ax.set_xticklabels([s['condition'] for s in stages], rotation=45,
                           ha='right', fontsize='small')
    else:
        for condition in conditions:
            pts = sorted((s['round'], s['score']) for s in stages
                         if s['condition'] == condition)
            if pts:
                ax.plot(*zip(*pts), marker='o', label=condition)
        ax.set_xlabel('round')
        ax.legend(fontsize='small')
    ax.set_ylabel(f'{score} (%)')
    ax.set_title(f'continual adaptation, mean {score} {mean:.1f} %')
    ax.grid(alpha=.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
