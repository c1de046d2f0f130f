"""``ContinualIoUMetric``: mIoU per stage of a continual stream."""
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

from ..datasets.acdc import STREAM_TAGS
from .continual_report import (append_partial, format_table,
                               mean_ignoring_nan, stage_result,
                               write_results)


@METRICS.register_module()
class ContinualIoUMetric(BaseMetric):
    """mIoU per stage of a continual stream (CoTTA's ACDC protocol).

    ``process`` appends one ``dict(stage, round, condition, areas)`` per
    image to ``self.results`` (``areas``: ``[4, C]`` intersection, union,
    prediction and label areas, as ``IoUMetric.intersect_and_union``), so
    MMEngine gathers them across ranks. ``compute_metrics`` sums the areas
    of each stage (a stage's IoU is not a mean of per-image IoUs), prints
    the paper's table and writes JSON/CSV/PNG into ``output_dir``.

    When the stage changes in ``process``, the finished stage is logged and
    appended to ``<output_dir>/continual_results.partial.jsonl`` at once, so
    a crashed run keeps its finished stages. Samples need the stream tags
    of ``ACDCContinualDataset`` (``PackSegInputs(meta_keys=...)``).

    Args:
        ignore_index (int): label ignored by the metric. Default: 255.
        output_dir (str, optional): where results are written. Default:
            None (``OnlineAdaptationLoop`` sets the work dir).
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
        self._current: Optional[int] = None  # stage of the last image
        self._partial_started = False

    @property
    def class_names(self) -> List[str]:
        """Class names of the dataset (Cityscapes' 19 if not set)."""
        meta = self.dataset_meta
        if not meta or 'classes' not in meta:
            meta = CityscapesDataset.METAINFO
        return list(meta['classes'])

    def process(self, data_batch: dict, data_samples: Sequence[dict]) -> None:
        """Append each image's stage tags and IoU areas to ``results``.

        Args:
            data_batch (dict): unused.
            data_samples (Sequence[dict]): ``SegDataSample`` outputs (dicts
                or data elements) with ``pred_sem_seg``, ``gt_sem_seg`` and
                the ``stage``/``round``/``condition`` metainfo.
        """
        num_classes = len(self.class_names)
        for sample in data_samples:
            if isinstance(sample, BaseDataElement):
                sample = sample.to_dict()
            missing = [k for k in STREAM_TAGS + ('pred_sem_seg', 'gt_sem_seg')
                       if k not in sample]
            if missing:
                raise KeyError(
                    f'ContinualIoUMetric: sample {sample.get("img_path")} has '
                    f'no {missing}; add {STREAM_TAGS} to PackSegInputs '
                    'meta_keys (mmseg_stag.segmentation.CONTINUAL_META_KEYS)')
            pred = sample['pred_sem_seg']['data'].squeeze()
            label = sample['gt_sem_seg']['data'].squeeze().to(pred)
            if pred.shape != label.shape:
                raise ValueError(
                    f'ContinualIoUMetric: prediction {tuple(pred.shape)} and '
                    f'label {tuple(label.shape)} of {sample.get("img_path")} '
                    'differ in size; predictions must be at the original '
                    'image size')
            stage = int(sample['stage'])
            if self._current is not None and stage != self._current:
                self._finish_stage(self._current)
            self._current = stage
            areas = torch.stack(IoUMetric.intersect_and_union(
                pred, label, num_classes, self.ignore_index))
            self.results.append(dict(
                stage=stage, round=int(sample['round']),
                condition=str(sample['condition']),
                areas=areas.cpu().numpy().astype(np.float64)))

    def _stage_results(self, results: List[dict]) -> List[dict]:
        """One result per stage, in stage order, from per-image records."""
        stages: Dict[int, dict] = OrderedDict()
        for r in sorted(results, key=lambda r: r['stage']):
            s = stages.get(r['stage'])
            if s is None:
                stages[r['stage']] = dict(r, areas=r['areas'].copy(),
                                          num_images=1)
            else:
                s['areas'] += r['areas']
                s['num_images'] += 1
        return [stage_result(s['stage'], s['round'], s['condition'],
                             s['areas'], s['num_images'], self.class_names)
                for s in stages.values()]

    def end_stage(self) -> None:
        """The stream's current stage is over: log it and append it to the
        partial file now (``OnlineAdaptationLoop`` calls this at every
        stage boundary, before it saves the run state)."""
        if self._current is not None:
            self._finish_stage(self._current)
        self._current = None

    def state_dict(self) -> dict:
        """The per-image areas so far (plain tensors and numbers), for the
        run state of a resumable stream; call after :meth:`end_stage`."""
        if self._current is not None:
            raise RuntimeError('ContinualIoUMetric.state_dict: call '
                               'end_stage() first (a stage is open)')
        return dict(results=[dict(r, areas=torch.from_numpy(r['areas']))
                             for r in self.results])

    def load_state_dict(self, state: dict) -> None:
        """Continue from :meth:`state_dict`; rewrites the partial file with
        the restored stages (dropping a stage a crash wrote after the run
        state was saved)."""
        self.results = [dict(r, areas=r['areas'].numpy().astype(np.float64))
                        for r in state['results']]
        self._current, self._partial_started = None, False
        if self.output_dir is not None:
            for result in self._stage_results(self.results):
                append_partial(self.output_dir, result,
                               fresh=not self._partial_started)
                self._partial_started = True

    def _finish_stage(self, stage: int) -> None:
        """Log a finished stage and append it to the partial file."""
        result, = self._stage_results(
            [r for r in self.results if r['stage'] == stage])
        if self.output_dir is not None:
            append_partial(self.output_dir, result,
                           fresh=not self._partial_started)
            self._partial_started = True
        print_log(f"stage {stage} (round {result['round']}, "
                  f"{result['condition']}): mIoU {result['mIoU']:.2f}",
                  logger='current')

    def compute_metrics(self, results: list) -> Dict[str, float]:
        """Per-stage mIoU from the gathered per-image areas; prints the table
        and writes the files.

        Returns:
            dict[str, float]: ``mIoU`` (mean over stages, %) and one
            ``r<round>_<condition>`` mIoU per stage (2 decimals).
        """
        self.end_stage()
        self._partial_started = False
        if not results:
            raise ValueError('ContinualIoUMetric: no sample was processed')
        stages = self._stage_results(results)
        conditions = list(OrderedDict.fromkeys(s['condition']
                                               for s in stages))
        print_log('continual mIoU (%):\n' + format_table(stages, conditions),
                  logger='current')
        if self.output_dir is not None:
            write_results(self.output_dir, stages, conditions,
                          self.class_names)
        metrics = {'mIoU': mean_ignoring_nan([s['mIoU'] for s in stages])}
        for s in stages:
            key = f"r{s['round']}_{s['condition']}"
            if key in metrics:
                key += f"_s{s['stage']}"
            metrics[key] = round(s['mIoU'], 2)
        return metrics
