"""Online predict-then-adapt evaluation of adaptation methods on a stream.

Each *row* (a method, with or without STAG) starts from the source model.
For every stage of the stream (:mod:`.scenarios`) whose ``reset`` flag is
set, the model is restored to the source weights and the method rebuilt
(fresh optimizer, ``t = 0`` so ``beta_t = beta0``) and torch's generator
reseeded; then every batch is predicted by the model as it is *before*
adapting on that batch (one forward pass serves the prediction and the
loss). Correct predictions are counted per corruption.

Finished stages are appended to a jsonl file as they end, and the row's
run state (the method's state and the random states,
:mod:`mmseg_stag.core.run_state`, as the segmentation loop saves it) is
written next to it, atomically, after every stage: ``resume=True``
continues a killed row after its last finished stage, with the numbers of
the uninterrupted run (a recorded stage followed by a reset is skipped even
without a state file).
"""
import copy
import hashlib
import json
import os.path as osp
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence

import numpy as np
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, Dataset

from mmseg_stag.core import (BatchContext, HeadProbe, build_method,
                             use_batch_statistics)
from mmseg_stag.core.run_state import (load_run_state, rng_state,
                                       save_run_state, set_rng_state)
from .data import StreamData
from .scenarios import Stage

#: Display names of the registered methods (paper spelling).
METHOD_NAMES = {
    'source': 'Source', 'bn_adapt': 'BN Adapt',
    'tent': 'TENT', 'eata': 'EATA', 'sar': 'SAR', 'deyo': 'DeYO',
    'cotta': 'CoTTA'
}


def method_display_name(method_type: str) -> str:
    return METHOD_NAMES.get(str(method_type).lower(), str(method_type))


@dataclass
class RowSpec:
    """One row of a results table.

    Args:
        name: row title, e.g. ``'TENT'``, ``'TENT+STAG'``.
        method: a ``METHODS`` config (``type`` and its arguments; a
            ``stag`` key turns STAG on).
        base: for a +STAG row, the name of the row it improves on (the
            table's gain column).
        bn_batch_stats: BatchNorm layers normalise with the test batch's
            statistics (tent's ``configure_model``; BN Adapt). Applied
            before the method is configured, so copies it makes (teachers)
            inherit it.
    """
    name: str
    method: dict
    base: Optional[str] = None
    bn_batch_stats: bool = False


def rows_from_config(method: dict,
                     stag: Optional[dict] = None,
                     rows: Sequence[str] = ('base', 'stag'),
                     bn_batch_stats: bool = True,
                     name: Optional[str] = None) -> List[RowSpec]:
    """The rows of one ``method`` ± ``stag`` config.

    Args:
        method: the baseline's ``METHODS`` config (without ``stag``).
        stag: ``dict(beta0, gamma, ...)`` of the +STAG row.
        rows: any of ``'source'``, ``'base'``, ``'stag'``.
        bn_batch_stats: see :class:`RowSpec` (never for Source).
        name: the baseline's display name (default from its type).
    """
    unknown = set(rows) - {'source', 'base', 'stag'}
    if unknown:
        raise ValueError(f"rows must be among 'source', 'base', 'stag'; got "
                         f'{sorted(unknown)}')
    method = dict(method)
    if 'stag' in method:
        raise ValueError('put STAG settings in the top-level `stag` of the '
                         'config, not in `method`')
    name = name or method_display_name(method['type'])
    specs = []
    if 'source' in rows:
        specs.append(RowSpec('Source', dict(type='source')))
    if 'base' in rows:
        specs.append(RowSpec(name, method, bn_batch_stats=bn_batch_stats))
    if 'stag' in rows:
        if not stag:
            raise ValueError("row 'stag' needs a `stag=dict(beta0=...,"
                             " gamma=...)` in the config")
        specs.append(RowSpec(f'{name}+STAG', dict(method, stag=dict(stag)),
                             base=name if 'base' in rows else None,
                             bn_batch_stats=bn_batch_stats))
    return specs


class _Batches(Dataset):
    """Batch ``i`` of a stage as one item (for a prefetching DataLoader)."""

    def __init__(self, data: StreamData, batches: List[np.ndarray]):
        self.data, self.batches = data, batches

    def __len__(self):
        return len(self.batches)

    def __getitem__(self, i):
        return self.data.load(self.batches[i])


def iterate_batches(data: StreamData, batches: List[np.ndarray],
                    num_workers: int = 0):
    """``(images, labels, domain)`` per batch, in order."""
    if num_workers <= 0:
        for b in batches:
            yield data.load(b)
        return
    yield from DataLoader(_Batches(data, batches), batch_size=None,
                          shuffle=False, num_workers=num_workers)


def run_key(*parts) -> str:
    """A short fingerprint of everything that determines a row's numbers."""
    text = json.dumps(parts, sort_keys=True, default=str)
    return hashlib.sha1(text.encode()).hexdigest()[:16]


def read_records(path: Optional[str], key: str) -> Dict[int, List[dict]]:
    """Finished stages of the run ``key`` in a jsonl file:
    ``{stage index: [record per corruption]}``."""
    done: Dict[int, List[dict]] = {}
    if not path or not osp.isfile(path):
        return done
    with open(path, encoding='utf-8') as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:  # a line cut by a crash
                continue
            if rec.get('key') == key:
                done.setdefault(rec['stage'], [])
                done[rec['stage']] = [
                    r for r in done[rec['stage']]
                    if r['corruption'] != rec['corruption']
                ] + [rec]
    return done


@dataclass
class RowResult:
    """Counts of one row, per corruption."""
    name: str
    corruptions: List[str]
    correct: Dict[str, int] = field(default_factory=dict)
    total: Dict[str, int] = field(default_factory=dict)
    num_updates: int = 0
    time_s: float = 0.0
    base: Optional[str] = None
    skipped_stages: int = 0

    def accuracy(self, corruption: str) -> float:
        total = self.total.get(corruption, 0)
        return 100.0 * self.correct.get(corruption, 0) / total \
            if total else float('nan')

    @property
    def avg_acc(self) -> float:
        """Mean of the per-corruption accuracies (the tables' Avg.)."""
        return float(np.mean([self.accuracy(c) for c in self.corruptions]))

    def to_dict(self) -> dict:
        per = {c: dict(correct=self.correct.get(c, 0),
                       total=self.total.get(c, 0),
                       acc=self.accuracy(c), err=100.0 - self.accuracy(c))
               for c in self.corruptions}
        n = sum(self.total.values())
        return dict(name=self.name, base=self.base, per_corruption=per,
                    avg_acc=self.avg_acc, avg_err=100.0 - self.avg_acc,
                    overall_acc=100.0 * sum(self.correct.values()) / n
                    if n else float('nan'),
                    num_updates=self.num_updates, time_s=self.time_s,
                    skipped_stages=self.skipped_stages)


def state_path(jsonl: str, key: str) -> str:
    """The run state of row ``key`` next to its jsonl file."""
    return osp.join(osp.dirname(osp.abspath(jsonl)), 'states', f'{key}.pth')


def recorded_state(jsonl: Optional[str], key: str,
                   done: Dict[int, List[dict]]) -> Optional[dict]:
    """The saved run state of row ``key`` if every stage up to its stage is
    fully recorded in the jsonl file (else ``None``: start earlier)."""
    if not jsonl or not osp.isfile(state_path(jsonl, key)):
        return None
    state = load_run_state(state_path(jsonl, key))  # corrupt: clear error
    if state.get('key') != key:
        raise ValueError(f'{state_path(jsonl, key)} holds the state of row '
                         f"{state.get('key')!r}, not {key!r}")
    complete = all(k in done and len(done[k]) == done[k][0].get(
        'n_records', -1) for k in range(state['stage'] + 1))
    return state if complete else None


def reseed(seed: int, stage: int) -> None:
    """Seed torch's generator for a stage that starts from the source."""
    torch.manual_seed(int(seed) * 100003 + int(stage))


@dataclass
class SourceData:
    """Clean source-domain images for methods that need them before the
    stream (``method.needs_source_data``: EATA's Fisher information).

    Args:
        dataset: a :class:`~.data.CorruptionSet` of clean images (e.g.
            ``ImageFolder``, ``NumpyImages``).
        batch_size: images per batch.
        seed: the batches are a seeded shuffle of the dataset (EATA's
            Fisher loader shuffles).
    """
    dataset: Dataset
    batch_size: int = 64
    seed: int = 0

    def batches(self, device: str):
        order = np.random.default_rng(self.seed).permutation(
            len(self.dataset))
        for start in range(0, len(order), self.batch_size):
            yield self.dataset.load(
                order[start:start + self.batch_size]).to(device)


def prepare(source: nn.Module, classifier_name: str, spec: RowSpec,
            device: str, source_data: Optional[SourceData] = None):
    """A fresh copy of the source model and a configured method (given the
    clean source batches it asks for)."""
    model = copy.deepcopy(source).to(device)
    if spec.bn_batch_stats:
        use_batch_statistics(model)
    method = build_method(copy.deepcopy(spec.method))
    probe = HeadProbe(classifier_name)
    method.configure(model, probe.classifier(model), 'per_sample')
    if method.needs_source_data:
        if source_data is None:
            raise ValueError(
                f'{spec.name}: {type(method).__name__} needs clean '
                'source-domain images before the stream (e.g. EATA\'s '
                'Fisher information): set `source_data` in the config, or '
                'turn that part off (EATA: method.fisher_alpha=0, i.e. ETA)')
        method.fit_source(probe, source_data.batches(device))
    return method


def run_row(spec: RowSpec,
            source: nn.Module,
            classifier_name: str,
            stages: List[Stage],
            data: StreamData,
            seed: int = 0,
            device: str = 'cpu',
            num_workers: int = 0,
            jsonl: Optional[str] = None,
            key: Optional[str] = None,
            resume: bool = False,
            log: Optional[Callable[[str], None]] = print,
            log_interval: int = 0,
            source_data: Optional[SourceData] = None) -> RowResult:
    """Run one row over the whole stream.

    Args:
        spec: the method.
        source: the source model (never modified: every reset copies it).
        classifier_name: module name of its classifier.
        stages: the stream.
        data: the corruption sets the stream indexes.
        seed: seed of torch's generator (reseeded at every reset).
        device: where the model runs.
        num_workers: DataLoader workers that prefetch batches.
        jsonl: append one record per finished (stage, corruption) here.
        key: run fingerprint stored in the records (see :func:`run_key`).
        resume: reuse the records of ``key`` found in ``jsonl``.
        log: progress printer (``None``: silent).
        log_interval: also log every this many batches (0: per stage).
        source_data: clean images for methods that need them (EATA).
    """
    key = key or run_key(spec.name, spec.method, spec.bn_batch_stats, seed)
    probe = HeadProbe(classifier_name)
    build_method(spec.method).check_output('per_sample')  # before any work
    result = RowResult(spec.name, list(data.names), base=spec.base)
    done = read_records(jsonl, key) if resume else {}
    saved = recorded_state(jsonl, key, done) if resume else None
    method = None
    start = time.time()
    for k, stage in enumerate(stages):
        next_resets = k + 1 == len(stages) or stages[k + 1].reset
        if (saved is not None and k <= saved['stage']) or (
                next_resets and k in done and
                len(done[k]) == done[k][0].get('n_records', -1)):
            for rec in done[k]:
                c = rec['corruption']
                result.correct[c] = result.correct.get(c, 0) + rec['correct']
                result.total[c] = result.total.get(c, 0) + rec['total']
                result.num_updates += rec.get('num_updates', 0)
            result.skipped_stages += 1
            method = None  # the next stage resets anyway
            if log:
                log(f'[{spec.name}] {stage.name}: recorded, skipped')
            continue
        if saved is not None and k == saved['stage'] + 1 and \
                not stage.reset:  # continue the killed run's state
            method = prepare(source, classifier_name, spec, device,
                             source_data)
            method.load_state_dict(saved['method'])
            set_rng_state(saved['rng'])
            updates_before = method.num_updates
            if log:
                log(f'[{spec.name}] resumed after stage {saved["stage"]}')
        elif stage.reset or method is None:
            reseed(seed, k)
            method = prepare(source, classifier_name, spec, device,
                             source_data)
            updates_before = 0
        else:
            updates_before = method.num_updates
        correct = np.zeros(len(data.names), dtype=np.int64)
        total = np.zeros(len(data.names), dtype=np.int64)
        t0 = time.time()
        batches = iterate_batches(data, stage.batches, num_workers)
        for i, (x, y, domain) in enumerate(batches):
            method.on_stage(stage.name)
            with torch.set_grad_enabled(method.updates):
                logits, _ = method.adapt(BatchContext(x.to(device), probe))
            hit = (logits.argmax(1).cpu() == y).numpy()
            np.add.at(correct, domain.numpy(), hit)
            np.add.at(total, domain.numpy(), 1)
            if log and log_interval and (i + 1) % log_interval == 0:
                log(f'[{spec.name}] {stage.name}: {i + 1}/'
                    f'{len(stage.batches)} batches, running acc '
                    f'{100.0 * correct.sum() / max(total.sum(), 1):.2f}%')
        elapsed = time.time() - t0
        stage_updates = method.num_updates - updates_before
        result.num_updates += stage_updates
        records = []
        for d in np.nonzero(total)[0]:
            c = data.names[d]
            result.correct[c] = result.correct.get(c, 0) + int(correct[d])
            result.total[c] = result.total.get(c, 0) + int(total[d])
            records.append(dict(
                key=key, row=spec.name, stage=k, stage_name=stage.name,
                corruption=c, correct=int(correct[d]), total=int(total[d]),
                acc=100.0 * correct[d] / total[d],
                num_updates=stage_updates if len(records) == 0 else 0,
                time_s=elapsed))
        for rec in records:
            rec['n_records'] = len(records)
        if jsonl:
            with open(jsonl, 'a', encoding='utf-8') as f:
                for rec in records:
                    f.write(json.dumps(rec) + '\n')
            save_run_state(state_path(jsonl, key), dict(
                key=key, stage=k, method=method.state_dict(),
                rng=rng_state()))
        if log:
            acc = 100.0 * correct.sum() / max(total.sum(), 1)
            log(f'[{spec.name}] {stage.name}: acc {acc:.2f}% '
                f'(n={int(total.sum())}, {elapsed:.1f} s)')
    result.time_s = time.time() - start
    return result
