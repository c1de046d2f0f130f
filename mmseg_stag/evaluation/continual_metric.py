"""``ContinualIoUMetric``: mIoU per stage of a continual TTA stream."""
import csv
import json
import os
import os.path as osp
from collections import OrderedDict
from typing import Dict, List, Optional, Sequence

import numpy as np
import torch
from mmengine.evaluator import BaseMetric
from mmengine.logging import print_log
from mmseg.datasets import CityscapesDataset
from mmseg.evaluation.metrics import IoUMetric
from mmseg.registry import METRICS

TAG_KEYS = ('stage', 'round', 'condition')


def stage_iou(areas: np.ndarray) -> np.ndarray:
    """Per-class IoU (``nan`` where a class is absent from gt and prediction)
    from accumulated ``[intersection, union, pred, label]`` areas."""
    intersect, union = areas[0], areas[1]
    with np.errstate(divide='ignore', invalid='ignore'):
        return np.where(union > 0, intersect / union, np.nan)


def format_table(stages: List[dict], conditions: Sequence[str]) -> str:
    """The paper's layout: rows = rounds, columns = conditions + mean."""
    rounds = sorted({s['round'] for s in stages})
    lines = ['Round | ' + ' | '.join(f'{c:>6}' for c in conditions) +
             ' |   Mean']
    for r in rounds:
        row = {s['condition']: s['mIoU'] for s in stages if s['round'] == r}
        vals = [row.get(c) for c in conditions]
        done = [v for v in vals if v is not None]
        lines.append(f'{r:>5} | ' + ' | '.join(
            f'{v:6.1f}' if v is not None else '     -' for v in vals) +
            f' | {np.mean(done):6.1f}')
    mean = np.mean([s['mIoU'] for s in stages])
    lines.append(f'mean over {len(stages)} stages: {mean:.1f} mIoU')
    return '\n'.join(lines)


def write_results(output_dir: str, stages: List[dict],
                  conditions: Sequence[str], class_names: Sequence[str]
                  ) -> None:
    """``continual_results.json``/``.csv`` and ``continual_miou.png``."""
    os.makedirs(output_dir, exist_ok=True)
    mean = float(np.mean([s['mIoU'] for s in stages]))
    with open(osp.join(output_dir, 'continual_results.json'), 'w') as f:
        json.dump(dict(stages=stages, mean_mIoU=mean,
                       conditions=list(conditions),
                       rounds=max(s['round'] for s in stages)), f, indent=1)
    with open(osp.join(output_dir, 'continual_results.csv'), 'w',
              newline='') as f:
        writer = csv.writer(f)
        writer.writerow(['stage', 'round', 'condition', 'mIoU',
                         'num_images'] + list(class_names))
        for s in stages:
            writer.writerow([s['stage'], s['round'], s['condition'],
                             f"{s['mIoU']:.2f}", s['num_images']] + [
                                 '' if s['per_class_IoU'][c] is None else
                                 f"{s['per_class_IoU'][c]:.2f}"
                                 for c in class_names])
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6, 3.5))
    for condition in conditions:
        pts = [(s['round'], s['mIoU']) for s in stages
               if s['condition'] == condition]
        if pts:
            ax.plot(*zip(*pts), marker='o', label=condition)
    ax.set_xlabel('round')
    ax.set_ylabel('mIoU (%)')
    ax.set_title(f'continual TTA, mean {mean:.1f} mIoU')
    ax.grid(alpha=.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(osp.join(output_dir, 'continual_miou.png'), dpi=120)
    plt.close(fig)


@METRICS.register_module()
class ContinualIoUMetric(BaseMetric):
    """mIoU per stage of a continual stream (CoTTA's ACDC protocol).

    Intersection and union are accumulated over each whole stage (not a mean
    of per-image IoUs); a stage's mIoU is the mean over classes present in
    its ground truth or prediction. The reported ``mIoU`` is the mean over
    stages. Samples need the ``stage``, ``round`` and ``condition`` tags of
    ``ACDCContinualDataset`` (``PackSegInputs(meta_keys=...)``).

    When a stage ends its result is appended to
    ``<output_dir>/continual_results.partial.jsonl`` at once, so a crashed
    run keeps its finished stages; at the end the table is printed and the
    JSON/CSV/PNG are written to ``output_dir`` (``TTAHook`` sets it to the
    work dir when it is ``None``).

    Args:
        ignore_index (int): label ignored by the metric. Default: 255.
        output_dir (str, optional): where results are written.
        collect_device (str): see ``BaseMetric``.
        prefix (str, optional): see ``BaseMetric``.
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
        self._stage_areas: Dict[int, np.ndarray] = OrderedDict()
        self._stage_tags: Dict[int, dict] = {}
        self._finished: List[dict] = []
        self._current: Optional[int] = None

    @property
    def class_names(self) -> List[str]:
        meta = self.dataset_meta or CityscapesDataset.METAINFO
        return list(meta['classes'])

    def _stage_result(self, stage: int) -> dict:
        iou = stage_iou(self._stage_areas[stage]) * 100
        tags = self._stage_tags[stage]
        return dict(
            stage=stage,
            round=tags['round'],
            condition=tags['condition'],
            mIoU=float(np.nanmean(iou)),
            num_images=tags['num_images'],
            per_class_IoU={
                c: None if np.isnan(v) else float(v)
                for c, v in zip(self.class_names, iou)
            })

    def _finish_stage(self, stage: int) -> None:
        result = self._stage_result(stage)
        self._finished.append(result)
        if self.output_dir is not None:
            os.makedirs(self.output_dir, exist_ok=True)
            # a new run starts the file afresh; later stages append
            mode = 'a' if len(self._finished) > 1 else 'w'
            with open(osp.join(self.output_dir,
                               'continual_results.partial.jsonl'), mode) as f:
                f.write(json.dumps(result) + '\n')
        print_log(f"stage {stage} (round {result['round']}, "
                  f"{result['condition']}): mIoU {result['mIoU']:.2f}",
                  logger='current')

    def process(self, data_batch: dict, data_samples: Sequence[dict]) -> None:
        num_classes = len(self.class_names)
        for sample in data_samples:
            missing = [k for k in TAG_KEYS if k not in sample]
            if missing:
                raise KeyError(
                    f'ContinualIoUMetric: sample {sample.get("img_path")} has '
                    f'no {missing}; add {TAG_KEYS} to PackSegInputs meta_keys '
                    '(mmseg_stag.datasets.CONTINUAL_META_KEYS)')
            stage = int(sample['stage'])
            if self._current is not None and stage != self._current:
                self._finish_stage(self._current)
            self._current = stage
            pred = sample['pred_sem_seg']['data'].squeeze()
            label = sample['gt_sem_seg']['data'].squeeze().to(pred)
            areas = torch.stack(IoUMetric.intersect_and_union(
                pred, label, num_classes, self.ignore_index)).cpu().numpy()
            if stage in self._stage_areas:
                self._stage_areas[stage] += areas
                self._stage_tags[stage]['num_images'] += 1
            else:
                self._stage_areas[stage] = areas.astype(np.float64)
                self._stage_tags[stage] = dict(
                    round=int(sample['round']),
                    condition=str(sample['condition']), num_images=1)
        # results live in this object; BaseMetric only needs a count
        self.results.extend([None] * len(data_samples))

    def compute_metrics(self, results: list) -> Dict[str, float]:
        if self._current is not None:
            self._finish_stage(self._current)
        stages = sorted(self._finished, key=lambda s: s['stage'])
        if not stages:
            raise ValueError('ContinualIoUMetric: no sample was processed')
        conditions = list(OrderedDict.fromkeys(s['condition']
                                               for s in stages))
        print_log('continual mIoU (%):\n' + format_table(stages, conditions),
                  logger='current')
        if self.output_dir is not None:
            write_results(self.output_dir, stages, conditions,
                          self.class_names)
        metrics = {'mIoU': float(np.mean([s['mIoU'] for s in stages]))}
        for s in stages:
            metrics[f"r{s['round']}_{s['condition']}"] = round(s['mIoU'], 2)
        self._reset_state()
        return metrics

    def _reset_state(self) -> None:
        self._stage_areas.clear()
        self._stage_tags.clear()
        self._finished = []
        self._current = None
