"""Accuracy metric of a classification stream, per stage and per corruption."""
import itertools
from typing import Dict, List, Optional

from mmseg_stag.engine.report import (mean_ignoring_nan, result_file,
                                      write_files)
from mmseg_stag.engine.stream_metric import StreamMetric
from mmseg_stag.registry import METRICS
from .corruption_table import TABLE_METRICS

#: the per-image file of a classification run (each image's prediction in
#: stream order, written at the end of a stream), and its columns
PER_IMAGE_FILE = 'per_image.csv'
PER_IMAGE_COLUMNS = ('image', 'batch', 'stage', 'round', 'corruption',
                     'correct')


def counts_result(correct: int, total: int) -> dict:
    """Return ``correct``, ``total``, ``acc`` and ``err`` (%)."""
    acc = 100.0 * correct / total if total else float('nan')
    return dict(correct=int(correct), total=int(total), acc=acc,
                err=100.0 - acc)


@METRICS.register_module()
class StreamAccuracyMetric(StreamMetric):
    """Top-1 accuracy per stage and per corruption of a classification stream;
    ``table_metric`` (``'acc'`` or ``'err'``) is what the paper's table shows,
    the other arguments are ``StreamMetric``'s (``keep_results``, which
    ``tools/test.py --out`` sets: only ``True``)."""

    default_prefix = 'stream'
    score_name = 'acc'
    task = 'classification'

    def __init__(self, table_metric: str = 'acc',
                 output_dir: Optional[str] = None,
                 collect_device: str = 'cpu',
                 prefix: Optional[str] = None,
                 keep_results: bool = True,
                 **kwargs):
        if kwargs:
            raise TypeError(f'StreamAccuracyMetric: unknown arguments '
                            f'{sorted(kwargs)}')
        if table_metric not in TABLE_METRICS:
            raise ValueError(f'table_metric must be one of {TABLE_METRICS},'
                             f' got {table_metric!r}')
        super().__init__(output_dir, collect_device, prefix, keep_results)
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

    def stage_score(self, records: List[dict]):
        """Return the stage's accuracy; its correct count and
        ``[correct, total]`` per corruption as details."""
        sums: Dict[str, List[int]] = {}
        for r in records:
            counts = sums.setdefault(r['corruption'], [0, 0])
            counts[0] += r['correct']
            counts[1] += 1
        correct = sum(r['correct'] for r in records)
        return counts_result(correct, len(records))['acc'], dict(
            correct=correct, per_corruption=sums)

    def run_details(self, stages: List[dict]) -> dict:
        """The paper's numbers: per corruption over the whole stream, their
        mean (the tables' Avg.) and the accuracy pooled over all images."""
        sums = {c: [0, 0]
                for c in (self.dataset_meta or {}).get('corruptions', [])}
        for s in stages:
            for c, (correct, total) in s['details']['per_corruption'].items():
                counts = sums.setdefault(c, [0, 0])
                counts[0] += correct
                counts[1] += total
        per = {c: counts_result(*v) for c, v in sums.items() if v[1]}
        correct = sum(v['correct'] for v in per.values())
        total = sum(v['total'] for v in per.values())
        return dict(table_metric=self.table_metric, corruptions=list(per),
                    per_corruption=per,
                    acc_mean_over_corruptions=mean_ignoring_nan(
                        [v['acc'] for v in per.values()]),
                    acc_pooled_over_images=counts_result(correct,
                                                         total)['acc'])

    def summary(self, record: dict) -> Dict[str, float]:
        return dict(super().summary(record),
                    acc_mean_over_corruptions=record['details'][
                        'acc_mean_over_corruptions'])

    def write_records(self, results: List[dict]) -> None:
        """Write ``per_image.csv`` (behind ``file_prefix``, as the other
        result files): per image, its position and correctness."""
        # the realistic protocol's runs: whether each image's batch adapted
        adapted = ('adapted', ) if results and 'adapted' in results[0] \
            else ()
        rows = ([i, r['batch'], r['stage'], r['round'], r['corruption'],
                 r['correct']] + [int(r[k]) for k in adapted]
                for i, r in enumerate(results))
        write_files(self.output_dir,
                    result_file(PER_IMAGE_FILE[:-len('.csv')],
                                self.file_prefix),
                    cells=itertools.chain([PER_IMAGE_COLUMNS + adapted],
                                          rows))
