"""Accuracy metric of a classification stream, per stage and per corruption."""
import csv
import os.path as osp
from collections import OrderedDict
from typing import Dict, List, Optional

from mmseg_stag.analysis.running import PER_IMAGE_FILE
from mmseg_stag.engine.report import mean_ignoring_nan, write_results
from mmseg_stag.engine.stream_metric import StreamMetric
from mmseg_stag.registry import METRICS

TABLE_METRICS = ('acc', 'err')
#: the per-image file of a classification run, and its columns
PER_IMAGE_COLUMNS = ('image', 'batch', 'stage', 'round', 'corruption',
                     'correct')


def counts_result(correct: int, total: int) -> dict:
    """Return ``correct``, ``total``, ``acc`` and ``err`` (%)."""
    acc = 100.0 * correct / total if total else float('nan')
    return dict(correct=int(correct), total=int(total), acc=acc,
                err=100.0 - acc)


@METRICS.register_module()
class StreamAccuracyMetric(StreamMetric):
    """Top-1 accuracy per stage and per corruption of a classification stream.

    Args:
        table_metric (str): ``'acc'`` or ``'err'``, what the paper's table
            shows. Default: 'acc'.
        output_dir (str, optional): See ``StreamMetric``. Default: None.
        collect_device (str): See ``BaseMetric``. Default: 'cpu'.
        prefix (str, optional): See ``BaseMetric``. Default: None.
    """

    default_prefix = 'stream'
    score = 'accuracy'

    def __init__(self, table_metric: str = 'acc',
                 output_dir: Optional[str] = None,
                 collect_device: str = 'cpu',
                 prefix: Optional[str] = None):
        if table_metric not in TABLE_METRICS:
            raise ValueError(f'table_metric must be one of {TABLE_METRICS},'
                             f' got {table_metric!r}')
        super().__init__(output_dir, collect_device, prefix)
        self.table_metric = table_metric

    def image_record(self, sample: dict) -> dict:
        missing = [k for k in ('gt_label', 'pred_label', 'corruption')
                   if k not in sample]
        if missing:
            raise KeyError(f'StreamAccuracyMetric: a sample has no {missing}'
                           ' (a CorruptionStream sample, predicted by the '
                           'online loop)')
        return dict(corruption=str(sample['corruption']),
                    correct=int(sample['pred_label'] == sample['gt_label']))

    def stage_result(self, records: List[dict]) -> dict:
        first = records[0]
        counts = per_corruption(records)
        correct = sum(r['correct'] for r in records)
        acc = counts_result(correct, len(records))['acc']
        return dict(stage=first['stage'], round=first['round'],
                    condition=first['condition'], accuracy=acc,
                    error=100.0 - acc, correct=correct,
                    num_images=len(records),
                    per_corruption={c: [v['correct'], v['total']]
                                    for c, v in counts.items()})

    def corruption_results(self, stages: List[dict]) -> Dict[str, dict]:
        """Return the counts per corruption over the whole stream."""
        sums: Dict[str, List[int]] = OrderedDict()
        for corruption in (self.dataset_meta or {}).get('corruptions', []):
            sums[corruption] = [0, 0]
        for s in stages:
            for c, (correct, total) in s['per_corruption'].items():
                acc = sums.setdefault(c, [0, 0])
                acc[0] += correct
                acc[1] += total
        return OrderedDict((c, counts_result(*v)) for c, v in sums.items()
                           if v[1])

    def summary(self, stages: List[dict]) -> Dict[str, float]:
        per = self.corruption_results(stages)
        acc = mean_ignoring_nan([v['acc'] for v in per.values()])
        return dict(accuracy=acc, error=100.0 - acc)

    def write(self, stages: List[dict], conditions: List[str]) -> None:
        per = self.corruption_results(stages)
        acc = mean_ignoring_nan([v['acc'] for v in per.values()])
        correct = sum(v['correct'] for v in per.values())
        total = sum(v['total'] for v in per.values())
        write_results(self.output_dir, stages, conditions, 'accuracy',
                      summary=dict(self.run_info,
                                   table_metric=self.table_metric,
                                   corruptions=list(per),
                                   per_corruption=per, avg_acc=acc,
                                   avg_err=100.0 - acc,
                                   overall_acc=counts_result(
                                       correct, total)['acc']))


    def write_records(self, results: List[dict]) -> None:
        """Write ``per_image.csv``: per image, its position and correctness."""
        path = osp.join(self.output_dir, PER_IMAGE_FILE)
        with open(path, 'w', newline='') as f:
            writer = csv.writer(f)
            writer.writerow(PER_IMAGE_COLUMNS)
            for i, r in enumerate(results):
                writer.writerow([i, r['batch'], r['stage'], r['round'],
                                 r['corruption'], r['correct']])


def per_corruption(records: List[dict]) -> Dict[str, dict]:
    """Return ``{corruption: counts}`` of image records, in order."""
    sums: Dict[str, List[int]] = OrderedDict()
    for r in records:
        acc = sums.setdefault(r['corruption'], [0, 0])
        acc[0] += r['correct']
        acc[1] += 1
    return OrderedDict((c, counts_result(*v)) for c, v in sums.items())
