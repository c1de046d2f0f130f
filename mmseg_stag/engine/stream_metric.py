"""``StreamMetric``: the per-stage bookkeeping both tasks' metrics share."""
from abc import abstractmethod
from collections import OrderedDict
from typing import Dict, List, Optional, Sequence

import numpy as np
import torch
from mmengine.evaluator import BaseMetric
from mmengine.logging import print_log
from mmengine.structures import BaseDataElement

from .report import (append_partial, format_table, mean_ignoring_nan,
                     write_results)

#: the tags every sample of a stream carries (dataset metainfo)
STREAM_TAGS = ('stage', 'round', 'condition')


class StreamMetric(BaseMetric):
    """A score per stage of an online stream, kept per image in
    ``self.results`` (so MMEngine gathers them), summed per stage in
    ``compute_metrics``.

    A finished stage is logged and appended to
    ``<output_dir>/continual_results.partial.jsonl`` at once (the online
    loop calls :meth:`end_stage`), so a crashed run keeps its finished
    stages; :meth:`state_dict` / :meth:`load_state_dict` carry the records
    through a resumed run. Subclasses define :meth:`image_record` (one
    image's numbers), :meth:`stage_result` (one stage's from its records)
    and ``score``.

    Args:
        output_dir (str, optional): where results are written. Default:
            None (the online loop sets the work dir).
        collect_device (str): see ``BaseMetric``. Default: 'cpu'.
        prefix (str, optional): see ``BaseMetric``.
    """

    #: the stage result's key that the table, plot and summary use
    score = 'score'

    def __init__(self,
                 output_dir: Optional[str] = None,
                 collect_device: str = 'cpu',
                 prefix: Optional[str] = None):
        super().__init__(collect_device=collect_device, prefix=prefix)
        self.output_dir = output_dir
        #: facts of the run the loop adds to the results (update steps)
        self.run_info: dict = {}
        self._current: Optional[int] = None  # stage of the last image
        self._partial_started = False
        self._batches = 0  # batches processed (an image's ``batch``)

    # -- to define --------------------------------------------------------
    @abstractmethod
    def image_record(self, sample: dict) -> dict:
        """One image's numbers (``sample``: the data sample as a dict)."""

    @abstractmethod
    def stage_result(self, records: List[dict]) -> dict:
        """One stage's result from its images' records."""

    def summary(self, stages: List[dict]) -> Dict[str, float]:
        """The metrics ``compute_metrics`` returns (and logs)."""
        return {self.score: mean_ignoring_nan([s[self.score]
                                               for s in stages])}

    def write(self, stages: List[dict], conditions: List[str]) -> None:
        """The result files of the run."""
        write_results(self.output_dir, stages, conditions, self.score,
                      summary=self.run_info)

    def write_records(self, results: List[dict]) -> None:
        """Per-image files of the run (none by default)."""

    # -- shared -----------------------------------------------------------
    def process(self, data_batch, data_samples: Sequence) -> None:
        """Append each image's stream tags and numbers to ``results``."""
        for sample in data_samples:
            if isinstance(sample, BaseDataElement):
                sample = sample.to_dict()
            missing = [k for k in STREAM_TAGS if k not in sample]
            if missing:
                raise KeyError(
                    f'{type(self).__name__}: sample {sample.get("img_path")} '
                    f'has no {missing}: the stream dataset must tag every '
                    f'sample with {STREAM_TAGS} (for segmentation, add them '
                    'to PackSegInputs meta_keys: CONTINUAL_META_KEYS)')
            stage = int(sample['stage'])
            if self._current is not None and stage != self._current:
                self._finish_stage(self._current)
            self._current = stage
            self.results.append(dict(
                self.image_record(sample), stage=stage,
                round=int(sample['round']),
                condition=str(sample['condition']), batch=self._batches))
        self._batches += 1

    def stage_results(self, results: List[dict]) -> List[dict]:
        """One result per stage, in stage order."""
        stages: Dict[int, List[dict]] = OrderedDict()
        for r in sorted(results, key=lambda r: r['stage']):
            stages.setdefault(r['stage'], []).append(r)
        return [self.stage_result(records) for records in stages.values()]

    def end_stage(self) -> None:
        """The stream's current stage is over: log it and append it to the
        partial file now (the online loop calls this when a stage's last
        image is done, before it saves the run state)."""
        if self._current is not None:
            self._finish_stage(self._current)
        self._current = None

    def state_dict(self) -> dict:
        """The per-image records so far (plain tensors and numbers), for
        the run state of a resumable stream; call after :meth:`end_stage`."""
        if self._current is not None:
            raise RuntimeError(f'{type(self).__name__}.state_dict: call '
                               'end_stage() first (a stage is open)')
        return dict(results=[
            {k: torch.from_numpy(v) if isinstance(v, np.ndarray) else v
             for k, v in r.items()} for r in self.results])

    def load_state_dict(self, state: dict) -> None:
        """Continue from :meth:`state_dict`; rewrites the partial file with
        the restored stages (dropping a stage a crash wrote after the run
        state was saved)."""
        self.results = [
            {k: v.numpy() if torch.is_tensor(v) else v for k, v in r.items()}
            for r in state['results']]
        self._current, self._partial_started = None, False
        self._batches = 1 + max((r.get('batch', -1) for r in self.results),
                                default=-1)
        if self.output_dir is not None:
            for result in self.stage_results(self.results):
                append_partial(self.output_dir, result,
                               fresh=not self._partial_started)
                self._partial_started = True

    def _finish_stage(self, stage: int) -> None:
        """Log a finished stage and append it to the partial file."""
        result, = self.stage_results(
            [r for r in self.results if r['stage'] == stage])
        if self.output_dir is not None:
            append_partial(self.output_dir, result,
                           fresh=not self._partial_started)
            self._partial_started = True
        print_log(f"stage {stage} (round {result['round']}, "
                  f"{result['condition']}): {self.score} "
                  f'{result[self.score]:.2f}', logger='current')

    def compute_metrics(self, results: list) -> Dict[str, float]:
        """Per-stage scores from the gathered per-image records; prints the
        table and writes the files.

        Returns:
            dict[str, float]: :meth:`summary` and one
            ``r<round>_<condition>`` score per stage (2 decimals).
        """
        self.end_stage()
        self._partial_started = False
        if not results:
            raise ValueError(f'{type(self).__name__}: no sample was '
                             'processed')
        stages = self.stage_results(results)
        conditions = list(OrderedDict.fromkeys(s['condition']
                                               for s in stages))
        print_log(f'continual {self.score} (%):\n' +
                  format_table(stages, conditions, self.score),
                  logger='current')
        if self.output_dir is not None:
            self.write(stages, conditions)
            self.write_records(results)
        metrics = self.summary(stages)
        for s in stages:
            key = f"r{s['round']}_{s['condition']}"
            if key in metrics:
                key += f"_s{s['stage']}"
            metrics[key] = round(s[self.score], 2)
        return metrics
