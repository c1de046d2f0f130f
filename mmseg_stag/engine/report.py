"""The results of an online run, either task: the per-stage table, and the
JSON / CSV / PNG / partial-jsonl files. A stage result is a dict with
``stage``, ``round``, ``condition``, ``num_images`` and its score under the
key ``score`` names (``'mIoU'`` for segmentation, ``'accuracy'`` for
classification), plus an optional per-column detail dict (per-class IoU)."""
import csv
import json
import math
import os
import os.path as osp
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

PARTIAL_FILE = 'continual_results.partial.jsonl'
RESULTS_FILE = 'continual_results.json'


def mean_ignoring_nan(values: Sequence[float]) -> float:
    """Mean ignoring ``nan`` (``nan`` if nothing is left)."""
    values = [v for v in values if v is not None and not math.isnan(v)]
    return float(np.mean(values)) if values else float('nan')


def score_key(stage: dict) -> str:
    """The key of a stage result's score: ``'mIoU'`` (segmentation) or
    ``'accuracy'`` (classification)."""
    return 'mIoU' if 'mIoU' in stage else 'accuracy'


def json_safe(value):
    """``nan`` -> ``None`` recursively (JSON has no NaN)."""
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


def format_table(stages: List[dict], conditions: Sequence[str],
                 score: str = 'mIoU') -> str:
    """The paper's table of a continual run.

    Args:
        stages (list[dict]): stage results (``round``, ``condition``, the
            score in %).
        conditions (Sequence[str]): column order.
        score (str): the key of the stage's score. Default: 'mIoU'.

    Returns:
        str: rows = rounds, columns = conditions + ``Mean`` (of the row), a
        ``Mean`` row (per condition over rounds) and the mean over stages;
        one decimal, ``-`` for a stage that did not run.
    """
    rounds = sorted({s['round'] for s in stages})

    def fmt(v):
        return '     -' if v is None else f'{v:6.1f}'

    lines = ['Round | ' + ' | '.join(f'{c:>6}' for c in conditions) +
             ' |   Mean']
    for r in rounds:
        row = {s['condition']: s[score] for s in stages if s['round'] == r}
        vals = [row.get(c) for c in conditions]
        lines.append(f'{r:>5} | ' + ' | '.join(fmt(v) for v in vals) +
                     f' | {fmt(mean_ignoring_nan(vals))}')
    col_means = [
        mean_ignoring_nan([s[score] for s in stages if s['condition'] == c])
        for c in conditions
    ]
    mean = mean_ignoring_nan([s[score] for s in stages])
    lines.append(' Mean | ' + ' | '.join(fmt(v) for v in col_means) +
                 f' | {fmt(mean)}')
    lines.append(f'mean over {len(stages)} stages: {mean:.1f} {score}')
    return '\n'.join(lines)


def append_partial(output_dir: str, result: dict, fresh: bool = False
                   ) -> str:
    """Append one finished stage to ``continual_results.partial.jsonl``.

    Args:
        output_dir (str): folder (created if needed).
        result (dict): one stage result.
        fresh (bool): start the file afresh (first stage of a run).

    Returns:
        str: the file path.
    """
    os.makedirs(output_dir, exist_ok=True)
    path = osp.join(output_dir, PARTIAL_FILE)
    with open(path, 'w' if fresh else 'a') as f:
        f.write(json.dumps(json_safe(result)) + '\n')
    return path


def read_partial(output_dir: str) -> List[dict]:
    """The stages ``continual_results.partial.jsonl`` holds, up to a line
    that a crash cut (or that is being written); none without the file."""
    stages = []
    path = osp.join(output_dir, PARTIAL_FILE)
    if osp.isfile(path):
        with open(path) as f:
            for line in f:
                try:
                    stages.append(json.loads(line))
                except json.JSONDecodeError:
                    break
    return stages


def write_results(output_dir: str, stages: List[dict],
                  conditions: Sequence[str], score: str = 'mIoU',
                  detail: Optional[Tuple[str, Sequence[str]]] = None,
                  summary: Optional[dict] = None) -> Dict[str, str]:
    """Write the results of an online run.

    Args:
        output_dir (str): folder (created if needed).
        stages (list[dict]): stage results (``stage``, ``round``,
            ``condition``, the score, ``num_images``).
        conditions (Sequence[str]): condition order (plot legend).
        score (str): the key of the stage's score. Default: 'mIoU'.
        detail (tuple, optional): ``(key, columns)``: a per-stage dict
            (e.g. ``('per_class_IoU', class names)``) written as CSV columns.
        summary (dict, optional): more top-level JSON fields.

    Returns:
        dict: paths of ``continual_results.json`` (``{"stages": [...],
        "mean_<score>", "score", "conditions", "rounds", **summary}``),
        ``continual_results.csv`` (one row per stage: stage, round,
        condition, score, the detail columns, num_images) and
        ``continual_<score>.png`` (score per condition vs round), keyed
        ``json``, ``csv``, ``png``.
    """
    os.makedirs(output_dir, exist_ok=True)
    paths = dict(json=osp.join(output_dir, RESULTS_FILE),
                 csv=osp.join(output_dir, 'continual_results.csv'),
                 png=osp.join(output_dir,
                              f'continual_{score.lower()}.png'))
    mean = mean_ignoring_nan([s[score] for s in stages])
    with open(paths['json'], 'w') as f:
        json.dump(json_safe(dict(stages=stages, **{f'mean_{score}': mean},
                                 score=score, conditions=list(conditions),
                                 rounds=max(s['round'] for s in stages),
                                 **(summary or {}))),
                  f, indent=1)

    def cell(v):
        return '' if v is None or math.isnan(v) else f'{v:.2f}'

    key, columns = detail or (None, [])
    with open(paths['csv'], 'w', newline='') as f:
        writer = csv.writer(f)
        writer.writerow(['stage', 'round', 'condition', score] +
                        list(columns) + ['num_images'])
        for s in stages:
            writer.writerow(
                [s['stage'], s['round'], s['condition'], cell(s[score])] +
                [cell(s[key].get(c)) for c in columns] + [s['num_images']])
    plot_stages(paths['png'], stages, conditions, score, mean)
    return paths


def plot_stages(path: str, stages: List[dict], conditions: Sequence[str],
                score: str, mean: float) -> None:
    """The score per condition vs round, one line per condition."""
    # an explicit Agg canvas: no pyplot, no global backend switch
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    fig = Figure(figsize=(6, 3.5))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    if len({s['round'] for s in stages}) == 1:
        # one pass (a classification stream): the score per stage, in order
        ax.plot(range(len(stages)), [s[score] for s in stages], marker='o')
        ax.set_xticks(range(len(stages)))
        ax.set_xticklabels([s['condition'] for s in stages], rotation=45,
                           ha='right', fontsize='small')
    else:
        for condition in conditions:
            pts = sorted((s['round'], s[score]) for s in stages
                         if s['condition'] == condition)
            if pts:
                ax.plot(*zip(*pts), marker='o', label=condition)
        ax.set_xlabel('round')
        ax.legend(fontsize='small')
    ax.set_ylabel(f'{score} (%)')
    ax.set_title(f'continual adaptation, mean {mean:.1f} {score}')
    ax.grid(alpha=.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
