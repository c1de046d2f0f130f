"""``ContinualIoUMetric``: mIoU per stage of a continual TTA stream."""
import csv
import json
import math
import os
import os.path as osp
from collections import OrderedDict
from typing import Dict, List, Optional, Sequence

import numpy as np
import torch
from mmengine.evaluator import BaseMetric
from mmengine.logging import print_log
from mmengine.structures import BaseDataElement
from mmseg.datasets import CityscapesDataset
from mmseg.evaluation.metrics import IoUMetric
from mmseg.registry import METRICS

TAG_KEYS = ('stage', 'round', 'condition')
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


def _mean(values: Sequence[float]) -> float:
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
                     f' | {fmt(_mean(vals))}')
    col_means = [
        _mean([s['mIoU'] for s in stages if s['condition'] == c])
        for c in conditions
    ]
    mean = _mean([s['mIoU'] for s in stages])
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


def write_results(output_dir: str, stages: List[dict],
                  conditions: Sequence[str], class_names: Sequence[str]
                  ) -> Dict[str, str]:
    """Write the results of a continual run.

    Args:
        output_dir (str): folder (created if needed).
        stages (list[dict]): stage results as ``ContinualIoUMetric`` makes
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
    mean = _mean([s['mIoU'] for s in stages])
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
    ax.set_title(f'continual TTA, mean {mean:.1f} mIoU')
    ax.grid(alpha=.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(paths['png'], dpi=120)
    return paths


@METRICS.register_module()
class ContinualIoUMetric(BaseMetric):
    """mIoU per stage of a continual stream (CoTTA's ACDC protocol).

    Intersection and union are accumulated over each whole stage (not a mean
    of per-image IoUs); a stage's mIoU is the mean over classes present in
    its ground truth or prediction. The reported ``mIoU`` is the mean over
    stages, in %. Samples need the ``stage``, ``round`` and ``condition``
    tags of ``ACDCContinualDataset`` (``PackSegInputs(meta_keys=...)``,
    see ``mmseg_stag.datasets.CONTINUAL_META_KEYS``).

    When the stage index changes in ``process`` the previous stage is
    finished: its result is logged and, if ``output_dir`` is set, appended to
    ``<output_dir>/continual_results.partial.jsonl`` at once, so a crashed
    run keeps its finished stages. At the end the table is printed and the
    JSON/CSV/PNG are written to ``output_dir``. ``output_dir`` is a public
    attribute: ``TTAHook`` sets it to the work dir when it is ``None``.

    The state lives in this object (an online stream runs in one process
    with batch size 1); results are not gathered across ranks.

    Args:
        ignore_index (int): label ignored by the metric. Default: 255.
        output_dir (str, optional): where results are written.
            Default: None (nothing written).
        collect_device (str): see ``BaseMetric``. Default: 'cpu'.
        prefix (str, optional): see ``BaseMetric``. Default: 'continual'.
    """

    default_prefix = 'continual'

    def __init__(self,
                 ignore_index: int = 255,
                 output_dir: Optional[str] = None,
                 collect_device: str = 'cpu',
                 prefix: Optional[str] = None,
                 **kwargs):
        kwargs.pop('keep_results', None)  # tools/test.py --out compatibility
        if kwargs:
            raise TypeError(f'ContinualIoUMetric: unknown arguments '
                            f'{sorted(kwargs)}')
        super().__init__(collect_device=collect_device, prefix=prefix)
        self.ignore_index = ignore_index
        self.output_dir = output_dir
        self._reset_state()

    @property
    def class_names(self) -> List[str]:
        """Class names of the dataset (Cityscapes' 19 if not set)."""
        meta = self.dataset_meta
        if not meta or 'classes' not in meta:
            meta = CityscapesDataset.METAINFO
        return list(meta['classes'])

    def _stage_result(self, stage: int) -> dict:
        iou = stage_iou(self._stage_areas[stage]) * 100
        tags = self._stage_tags[stage]
        return dict(
            stage=stage,
            round=tags['round'],
            condition=tags['condition'],
            mIoU=_mean(iou.tolist()),
            per_class_IoU={
                c: None if np.isnan(v) else float(v)
                for c, v in zip(self.class_names, iou)
            },
            num_images=tags['num_images'])

    def _finish_stage(self, stage: int) -> dict:
        result = self._stage_result(stage)
        self._finished[stage] = result
        if self.output_dir is not None:
            append_partial(self.output_dir, result,
                           fresh=not self._partial_started)
            self._partial_started = True
        print_log(f"stage {stage} (round {result['round']}, "
                  f"{result['condition']}): mIoU {result['mIoU']:.2f}",
                  logger='current')
        return result

    @staticmethod
    def _as_dict(sample) -> dict:
        if isinstance(sample, BaseDataElement):
            return sample.to_dict()
        return sample

    def process(self, data_batch: dict, data_samples: Sequence[dict]) -> None:
        """Add the areas of each sample to its stage.

        Args:
            data_batch (dict): unused.
            data_samples (Sequence[dict]): ``SegDataSample`` outputs of
                ``predict`` (as dicts or data elements) with ``pred_sem_seg``,
                ``gt_sem_seg`` and the ``stage``/``round``/``condition``
                metainfo.
        """
        num_classes = len(self.class_names)
        for sample in data_samples:
            sample = self._as_dict(sample)
            missing = [k for k in TAG_KEYS if k not in sample]
            if missing:
                raise KeyError(
                    f'ContinualIoUMetric: sample {sample.get("img_path")} has '
                    f'no {missing}; add {TAG_KEYS} to PackSegInputs meta_keys '
                    '(mmseg_stag.datasets.CONTINUAL_META_KEYS)')
            for key in ('pred_sem_seg', 'gt_sem_seg'):
                if key not in sample:
                    raise KeyError(f'ContinualIoUMetric: sample '
                                   f'{sample.get("img_path")} has no {key}')
            stage = int(sample['stage'])
            if self._current is not None and stage != self._current:
                self._finish_stage(self._current)
            if stage in self._finished and not self._warned_order:
                print_log(
                    f'ContinualIoUMetric: stage {stage} continues after it '
                    'finished; the stream is out of order (shuffled '
                    'sampler?). Its areas keep accumulating.',
                    logger='current', level=30)
                self._warned_order = True
            self._current = stage
            pred = sample['pred_sem_seg']['data'].squeeze()
            label = sample['gt_sem_seg']['data'].squeeze().to(pred)
            if pred.shape != label.shape:
                raise ValueError(
                    f'ContinualIoUMetric: prediction {tuple(pred.shape)} and '
                    f'label {tuple(label.shape)} of {sample.get("img_path")} '
                    'differ in size; predictions must be at the original '
                    'image size')
            areas = torch.stack(IoUMetric.intersect_and_union(
                pred, label, num_classes,
                self.ignore_index)).cpu().numpy().astype(np.float64)
            if stage in self._stage_areas:
                self._stage_areas[stage] += areas
                self._stage_tags[stage]['num_images'] += 1
            else:
                self._stage_areas[stage] = areas
                self._stage_tags[stage] = dict(
                    round=int(sample['round']),
                    condition=str(sample['condition']), num_images=1)
        # the state lives in this object; BaseMetric only needs a count
        self.results.extend([None] * len(data_samples))

    def compute_metrics(self, results: list) -> Dict[str, float]:
        """Finish the last stage, print the table, write the files.

        Args:
            results (list): unused (the state is kept per stage).

        Returns:
            dict[str, float]: ``mIoU`` (mean over stages, %) and one
            ``r<round>_<condition>`` mIoU per stage (2 decimals).
        """
        if self._current is not None:
            self._finish_stage(self._current)
        if not self._stage_areas:
            raise ValueError('ContinualIoUMetric: no sample was processed')
        # recomputed from the areas: authoritative even if a stage resumed
        stages = [self._stage_result(s) for s in sorted(self._stage_areas)]
        conditions = list(OrderedDict.fromkeys(s['condition']
                                               for s in stages))
        print_log('continual mIoU (%):\n' + format_table(stages, conditions),
                  logger='current')
        if self.output_dir is not None:
            write_results(self.output_dir, stages, conditions,
                          self.class_names)
        metrics = {'mIoU': _mean([s['mIoU'] for s in stages])}
        for s in stages:
            key = f"r{s['round']}_{s['condition']}"
            if key in metrics:
                key += f"_s{s['stage']}"
            metrics[key] = round(s['mIoU'], 2)
        self._reset_state()
        return metrics

    def _reset_state(self) -> None:
        self._stage_areas: Dict[int, np.ndarray] = OrderedDict()
        self._stage_tags: Dict[int, dict] = {}
        self._finished: Dict[int, dict] = OrderedDict()
        self._current: Optional[int] = None
        self._partial_started = False
        self._warned_order = False
