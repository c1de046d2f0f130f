"""The results of a continual run: per-stage IoU, the paper's table, and the
JSON / CSV / PNG / partial-jsonl files."""
import csv
import json
import math
import os
import os.path as osp
from typing import Dict, List, Sequence

import numpy as np

PARTIAL_FILE = 'continual_results.partial.jsonl'


def stage_iou(areas: np.ndarray) -> np.ndarray:
    """Per-class IoU from the areas accumulated over a stage.

    Args:
        areas (np.ndarray): ``[4, C]`` sums of intersection, union,
            prediction and label areas (``IoUMetric.intersect_and_union``).

    Returns:
        np.ndarray: ``[C]`` IoU in [0, 1], ``nan`` where a class is absent
        from both the ground truth and the prediction (as MMSeg does).
    """
    intersect, union = areas[0], areas[1]
    with np.errstate(divide='ignore', invalid='ignore'):
        return np.where(union > 0, intersect / union, np.nan)


def mean_ignoring_nan(values: Sequence[float]) -> float:
    """Mean ignoring ``nan`` (``nan`` if nothing is left)."""
    values = [v for v in values if v is not None and not math.isnan(v)]
    return float(np.mean(values)) if values else float('nan')


def _json_safe(value):
    """``nan`` -> ``None`` recursively (JSON has no NaN)."""
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value


def stage_result(stage: int, round_: int, condition: str,
                 areas: np.ndarray, num_images: int,
                 class_names: Sequence[str]) -> dict:
    """One stage's result (mIoU and per-class IoU in %) from its summed
    ``[4, C]`` areas."""
    iou = stage_iou(areas) * 100
    return dict(
        stage=stage,
        round=round_,
        condition=condition,
        mIoU=mean_ignoring_nan(iou.tolist()),
        per_class_IoU={c: None if np.isnan(v) else float(v)
                       for c, v in zip(class_names, iou)},
        num_images=num_images)


def format_table(stages: List[dict], conditions: Sequence[str]) -> str:
    """The paper's table of a continual run.

    Args:
        stages (list[dict]): stage results (``round``, ``condition``,
            ``mIoU`` in %).
        conditions (Sequence[str]): column order.

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
        row = {s['condition']: s['mIoU'] for s in stages if s['round'] == r}
        vals = [row.get(c) for c in conditions]
        lines.append(f'{r:>5} | ' + ' | '.join(fmt(v) for v in vals) +
                     f' | {fmt(mean_ignoring_nan(vals))}')
    col_means = [
        mean_ignoring_nan([s['mIoU'] for s in stages if s['condition'] == c])
        for c in conditions
    ]
    mean = mean_ignoring_nan([s['mIoU'] for s in stages])
    lines.append(' Mean | ' + ' | '.join(fmt(v) for v in col_means) +
                 f' | {fmt(mean)}')
    lines.append(f'mean over {len(stages)} stages: {mean:.1f} mIoU')
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
        f.write(json.dumps(_json_safe(result)) + '\n')
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
                  conditions: Sequence[str], class_names: Sequence[str]
                  ) -> Dict[str, str]:
    """Write the results of a continual run.

    Args:
        output_dir (str): folder (created if needed).
        stages (list[dict]): stage results as :func:`stage_result` makes
            them (``stage``, ``round``, ``condition``, ``mIoU``,
            ``per_class_IoU``, ``num_images``).
        conditions (Sequence[str]): condition order (plot legend).
        class_names (Sequence[str]): per-class CSV columns.

    Returns:
        dict: paths of ``continual_results.json`` (``{"stages": [...],
        "mean_mIoU", "conditions", "rounds"}``), ``continual_results.csv``
        (one row per stage: stage, round, condition, mIoU, per-class IoU...,
        num_images) and ``continual_miou.png`` (mIoU per condition vs
        round), keyed ``json``, ``csv``, ``png``.
    """
    os.makedirs(output_dir, exist_ok=True)
    paths = dict(json=osp.join(output_dir, 'continual_results.json'),
                 csv=osp.join(output_dir, 'continual_results.csv'),
                 png=osp.join(output_dir, 'continual_miou.png'))
    mean = mean_ignoring_nan([s['mIoU'] for s in stages])
    with open(paths['json'], 'w') as f:
        json.dump(_json_safe(dict(stages=stages, mean_mIoU=mean,
                                  conditions=list(conditions),
                                  rounds=max(s['round'] for s in stages))),
                  f, indent=1)

    def cell(v):
        return '' if v is None or math.isnan(v) else f'{v:.2f}'

    with open(paths['csv'], 'w', newline='') as f:
        writer = csv.writer(f)
        writer.writerow(['stage', 'round', 'condition', 'mIoU'] +
                        list(class_names) + ['num_images'])
        for s in stages:
            writer.writerow(
                [s['stage'], s['round'], s['condition'], cell(s['mIoU'])] +
                [cell(s['per_class_IoU'].get(c)) for c in class_names] +
                [s['num_images']])

    # an explicit Agg canvas: no pyplot, no global backend switch
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    fig = Figure(figsize=(6, 3.5))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    for condition in conditions:
        pts = sorted((s['round'], s['mIoU']) for s in stages
                     if s['condition'] == condition)
        if pts:
            ax.plot(*zip(*pts), marker='o', label=condition)
    ax.set_xlabel('round')
    ax.set_ylabel('mIoU (%)')
    ax.set_title(f'continual adaptation, mean {mean:.1f} mIoU')
    ax.grid(alpha=.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(paths['png'], dpi=120)
    return paths
