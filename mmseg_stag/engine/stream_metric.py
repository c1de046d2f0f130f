"""Per-stage bookkeeping shared by both tasks' stream metrics, and the
result file names of each metric of a run."""
import re
from abc import abstractmethod
from collections import OrderedDict
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch
from mmengine.evaluator import BaseMetric
from mmengine.logging import print_log
from mmengine.structures import BaseDataElement

from .report import (RESULTS_FILE, append_partial, format_stage_table,
                     results_record, write_results)
from .stream import StreamStage


class StreamMetric(BaseMetric):
    """Base metric that scores an online stream per stage, whose stages
    ``OnlineAdaptationLoop`` opens and closes (docs/running.md).

    Args:
        output_dir (str, optional): Where results are written. Default: None
            (the online loop sets the work dir).
        prefix (str, optional): MMEngine's prefix of the metric names; a
            run's second metric's result files start with it too
            (:func:`assign_result_files`). Default: ``default_prefix``.
        keep_results (bool): Only ``True``, what ``tools/test.py --out``
            (ours and MMSeg's own) sets beside ``output_dir``: the results
            are always kept (written to ``output_dir``). Default: True.

    Raises:
        ValueError: If ``keep_results`` is not True (nothing here deletes
            the results).
    """

    #: the name of each stage's ``score`` (``'mIoU'``, ``'acc'``)
    score_name = 'score'
    #: the task of the streams it scores, written in the results
    task = ''

    def __init__(self,
                 output_dir: Optional[str] = None,
                 collect_device: str = 'cpu',
                 prefix: Optional[str] = None,
                 keep_results: bool = True):
        if keep_results is not True:
            # MMSeg 0.x's option to delete the results after evaluating;
            # here they are the run's record, always written
            raise ValueError(
                f'{type(self).__name__}: keep_results={keep_results!r} is '
                f'not supported: the results are always kept ({RESULTS_FILE}'
                ' and the rest in output_dir, else the work dir); remove the '
                'option')
        super().__init__(collect_device=collect_device, prefix=prefix)
        self.output_dir = output_dir
        #: what the result file names start with (``report.result_file``;
        #: ``''``: the plain names); the online loop sets it
        self.file_prefix = ''
        #: facts of the run the loop adds to the results (update steps)
        self.run_info: dict = {}
        self._current: Optional[StreamStage] = None  # the open stage
        self._partial_started = False
        self._batches = 0  # batches processed (an image's ``batch``)

    @abstractmethod
    def image_record(self, sample: dict) -> dict:
        """Return one image's numbers from its data sample as a dict (a
        tensor stays where it is until :meth:`read_records`)."""

    @abstractmethod
    def stage_score(self, records: List[dict]) -> Tuple[float, dict]:
        """Return one stage's score (%) and details from its records."""

    def csv_detail(self) -> Optional[Tuple[str, Sequence[str]]]:
        """Return ``(key, columns)`` of a stage's ``details`` dict that the
        CSV file gets as columns (none by default)."""
        return None

    def run_details(self, stages: List[dict]) -> dict:
        """Return the task's run-level numbers (none by default)."""
        return {}

    def summary(self, record: dict) -> Dict[str, float]:
        """Return the summary metrics ``compute_metrics`` returns."""
        return {f'{self.score_name}_mean_over_stages':
                record['mean_over_stages']}

    def write_records(self, results: List[dict]) -> None:
        """Write per-image files of the run (none by default)."""

    def start_stage(self, stage: StreamStage) -> None:
        """Open ``stage``: the next images are its."""
        self.end_stage()
        self._current, self._tags = stage, stage.tags()

    def process(self, data_batch, data_samples: Sequence) -> None:
        """Append each image's numbers and its stage's tags to ``results``
        (``RuntimeError`` if no stage is open: not run by the online loop).
        """
        if self._current is None:
            raise RuntimeError(
                f'{type(self).__name__} scores an online stream: '
                'OnlineAdaptationLoop opens its stages (start_stage); set '
                "test_cfg=dict(type='OnlineAdaptationLoop', ...)")
        tags = self._tags  # the open stage's
        for sample in data_samples:
            if isinstance(sample, BaseDataElement):
                sample = sample.to_dict()
            record = dict(self.image_record(sample), **tags,
                          batch=self._batches)
            if 'adapted' in sample:  # the realistic protocol's mark
                record['adapted'] = bool(sample['adapted'])
            self.results.append(record)
        self._batches += 1

    @staticmethod
    def read_records(records: List[dict]) -> None:
        """Replace the tensors of ``records`` (an image's numbers, kept on
        the device by :meth:`image_record`) by NumPy arrays, in place: one
        transfer per field and device for all of them (a read per image
        would wait for the GPU at every image). A stage's end reads its
        records; a read record is not read again."""
        by_field: Dict[tuple, List[int]] = {}
        for i, record in enumerate(records):
            for key, value in record.items():
                if torch.is_tensor(value):
                    by_field.setdefault((key, value.device, value.dtype,
                                         tuple(value.shape)), []).append(i)
        for (key, *_), positions in by_field.items():
            values = torch.stack([records[i][key] for i in positions])
            for i, value in zip(positions, values.cpu().numpy()):
                records[i][key] = value

    def stage_results(self, results: List[dict]) -> List[dict]:
        """Return one result per stage, in stage order."""
        self.read_records(results)
        stages: Dict[int, List[dict]] = OrderedDict()
        for r in sorted(results, key=lambda r: r['stage']):
            stages.setdefault(r['stage'], []).append(r)
        return [self.stage_result(records) for records in stages.values()]

    def stage_result(self, records: List[dict]) -> dict:
        """Return one stage's result (``report``'s schema) from its
        images' records."""
        score, details = self.stage_score(records)
        first = records[0]
        result = dict(stage=first['stage'], round=first['round'],
                      condition=first['condition'], num_images=len(records),
                      score_name=self.score_name, score=score,
                      details=details)
        if 'adapted' in first:  # the realistic protocol (realtime)
            result['images_adapted'] = sum(r['adapted'] for r in records)
        return result

    def end_stage(self) -> Optional[dict]:
        """Close the open stage: log it, append it to the partial file;
        return its result (None if no stage was open)."""
        if self._current is None:
            return None
        stage = self._current.index
        # the stage's device values, read once (stage_results)
        result, = self.stage_results(
            [r for r in self.results if r['stage'] == stage])
        self._append_partial(result)
        print_log(f"{self._log_label}stage {stage} (round {result['round']}, "
                  f"{result['condition']}): {self.score_name} "
                  f"{result['score']:.2f}", logger='current')
        self._current = None
        return result

    def stage_scalars(self, result: dict) -> Dict[str, Tuple[float, int]]:
        """``{tag: (value, step)}`` of a closed stage for the visualizer's
        backends: the score along the stream (step: the stage's number) and
        per condition along the rounds (step: the round)."""
        name = self.prefix or type(self).__name__
        score = float(result['score'])
        return {f'{name}/{self.score_name}': (score, result['stage'] + 1),
                f"{name}/{result['condition']}/{self.score_name}":
                (score, int(result['round']))}

    def state_dict(self) -> dict:
        """Return the per-image records as plain tensors and numbers (a
        stage still open raises ``RuntimeError``)."""
        if self._current is not None:
            raise RuntimeError(f'{type(self).__name__}.state_dict: call '
                               'end_stage() first (a stage is open)')
        self.read_records(self.results)
        return dict(results=[
            {k: torch.from_numpy(v) if isinstance(v, np.ndarray) else v
             for k, v in r.items()} for r in self.results])

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict` and rewrite the partial file from it."""
        self.results = [
            {k: v.numpy() if torch.is_tensor(v) else v for k, v in r.items()}
            for r in state['results']]
        self._current, self._partial_started = None, False
        self._batches = 1 + max((r.get('batch', -1) for r in self.results),
                                default=-1)
        if self.output_dir is not None:
            for result in self.stage_results(self.results):
                self._append_partial(result)

    @property
    def _log_label(self) -> str:
        """What a log line of a run's second metric starts with (its file
        prefix), to tell it from the first's."""
        return f'{self.file_prefix}: ' if self.file_prefix else ''

    def _append_partial(self, result: dict) -> None:
        if self.output_dir is not None:
            append_partial(self.output_dir, result,
                           fresh=not self._partial_started,
                           prefix=self.file_prefix)
            self._partial_started = True

    def compute_metrics(self, results: list) -> Dict[str, float]:
        """Compute the per-stage scores, print the table, write the files;
        return :meth:`summary` and one ``r<round>_<condition>`` score per
        stage (rounded to 0.01)."""
        self.end_stage()
        self._partial_started = False
        if not results:
            raise ValueError(f'{type(self).__name__}: no sample was '
                             'processed')
        stages = self.stage_results(results)
        conditions = list(OrderedDict.fromkeys(s['condition']
                                               for s in stages))
        print_log(f'{self._log_label}continual {self.score_name} (%):\n' +
                  format_stage_table(stages, conditions), logger='current')
        record = results_record(self.task, stages, conditions,
                                self.run_details(stages), **self.run_info)
        if self.output_dir is not None:
            write_results(self.output_dir, record, self.csv_detail(),
                          prefix=self.file_prefix)
            self.write_records(results)
        metrics = self.summary(record)
        for s in stages:
            key = f"r{s['round']}_{s['condition']}"
            if key in metrics:
                key += f"_s{s['stage']}"
            metrics[key] = round(s['score'], 2)
        return metrics


def assign_result_files(metrics: Sequence) -> None:
    """Give each ``StreamMetric`` of a run's evaluator its own result file
    names (``file_prefix``): the first keeps the plain names
    (``continual_results.json``, ...), each other one gets its ``prefix``
    and ``_`` in front (``<prefix>_continual_results.json``, ...).

    Raises:
        ValueError: If two metrics have the same prefix (MMEngine's metric
            names and the result files would clash: refused here, before
            the stream rather than after it), if a metric but the first has
            none, or if it cannot be part of a file name.
    """
    seen: Dict[Optional[str], Tuple[int, BaseMetric]] = {}
    stream = [(i, m) for i, m in enumerate(metrics)
              if isinstance(m, StreamMetric)]
    for n, (i, metric) in enumerate(stream):
        prefix = metric.prefix
        fix = (f"give test_evaluator[{i}] a prefix of its own (e.g. "
               f"prefix='second'): a run's first StreamMetric writes "
               f"{RESULTS_FILE}, ..., each other one "
               f"<prefix>_{RESULTS_FILE}, ... (docs/running.md)")
        if prefix in seen:
            j, other = seen[prefix]
            raise ValueError(
                f'test_evaluator[{j}] ({describe(other)}) and '
                f'test_evaluator[{i}] ({describe(metric)}) would write the '
                'same metric names (and result files); ' + fix)
        if n and not prefix:
            j, other = stream[0]
            raise ValueError(
                f'test_evaluator[{i}] ({describe(metric)}) would write the '
                f'result files of test_evaluator[{j}] ({describe(other)}); '
                + fix)
        if n and not re.fullmatch(r'\w[\w.-]*', prefix):
            raise ValueError(
                f'test_evaluator[{i}] ({describe(metric)}): its prefix '
                'starts its result file names, so it takes letters, digits, '
                '_, . and - only (and starts with a letter, a digit or _)')
        seen[prefix] = (i, metric)
        metric.file_prefix = prefix if n else ''


def describe(metric: BaseMetric) -> str:
    """Return ``'<class>, prefix <prefix>'`` of a metric, for errors."""
    return f'{type(metric).__name__}, prefix {metric.prefix!r}'
