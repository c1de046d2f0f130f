"""One classification experiment from an MMEngine config (``configs/cls/``).

Config keys (the ``_base_`` files under ``configs/cls/_base_`` fill most):

* ``model``: ``dict(type=<CLS_MODELS>, checkpoint=..., classifier=None,
  ...)``;
* ``data``: ``dict(type='CIFARC' | 'ImageNetC', data_root=...,
  severity=5, corruptions=[...], ...)``;
* ``scenario``: ``dict(type='mild' | 'label_shift' | 'batch_size_1' |
  'mixed' | 'continual', batch_size=...)``;
* ``method``: the baseline's ``METHODS`` config (:mod:`mmseg_stag.core`);
  ``method_name``
  (optional) its display name;
* ``stag``: ``dict(beta0=..., gamma=...)`` of the +STAG row (paper Table
  appendix_hp);
* ``rows``: which of ``'source'``, ``'base'``, ``'stag'`` to run;
* ``bn_batch_stats``: adapted models normalise BatchNorm with the test
  batch's statistics (the baselines' reference code);
* ``metric``: ``'acc'`` (ImageNet-C tables) or ``'err'`` (CIFAR-C tables);
* ``source_data``: clean source-domain images for methods that need them
  (EATA's Fisher information): a ``CLS_DATASETS`` config (``ImageFolder``,
  ``NumpyImages``) plus ``batch_size``;
* ``seed``, ``device``, ``num_workers``, ``log_interval``, ``title``.
"""
import os
import os.path as osp
import time
from typing import Callable, Optional

from .data import StreamData, build_corruption_sets
from .registry import CLS_DATASETS
from .models import build_cls_model
from .report import format_table, write_results
from .runner import SourceData, rows_from_config, run_key, run_row
from .scenarios import build_stream


def _plain(obj):
    """Config objects (ConfigDict, tuples) as plain dicts/lists."""
    if hasattr(obj, 'to_dict'):
        obj = obj.to_dict()
    if isinstance(obj, dict):
        return {k: _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_plain(v) for v in obj]
    return obj


def run_experiment(cfg,
                   work_dir: str,
                   checkpoint: Optional[str] = None,
                   data_root: Optional[str] = None,
                   allow_unsafe_pickle: bool = False,
                   resume: bool = False,
                   log: Optional[Callable[[str], None]] = print) -> dict:
    """Run every row of ``cfg`` and write the results into ``work_dir``.

    Args:
        cfg: an MMEngine ``Config`` or a dict with the keys above.
        work_dir: output folder (``results.{json,csv,txt}``,
            ``progress.jsonl``).
        checkpoint: overrides ``model.checkpoint``.
        data_root: overrides ``data.data_root``.
        allow_unsafe_pickle: trust the weight file (``--trust-pickle``).
        resume: reuse the stages already in ``progress.jsonl``.
        log: progress printer.

    Returns:
        ``dict(rows=[...], table=str, paths={...})``.
    """
    get = cfg.get
    model_cfg = _plain(get('model'))
    data_cfg = _plain(get('data'))
    scenario_cfg = _plain(get('scenario'))
    if data_root:
        data_cfg['data_root'] = data_root
    if checkpoint:
        model_cfg['checkpoint'] = checkpoint
    seed = int(get('seed', 0))
    metric = get('metric', 'acc')
    os.makedirs(work_dir, exist_ok=True)

    sets = build_corruption_sets(data_cfg)
    data = StreamData(sets)
    stages = build_stream(scenario_cfg, data, seed)
    source, classifier = build_cls_model(
        model_cfg, allow_unsafe_pickle=allow_unsafe_pickle)
    source.to(get('device', 'cpu'))
    specs = rows_from_config(_plain(get('method', dict(type='source'))),
                             _plain(get('stag')),
                             _plain(get('rows', ['base', 'stag'])),
                             bool(get('bn_batch_stats', True)),
                             get('method_name'))
    if log:
        log(f'{len(data)} test images, {len(stages)} stage(s), '
            f'{sum(len(s.batches) for s in stages)} batches; classifier '
            f'{classifier!r}; rows: {[s.name for s in specs]}')
    source_cfg = _plain(get('source_data'))
    source_data = None
    if source_cfg:
        source_cfg = dict(source_cfg)
        batch_size = int(source_cfg.pop('batch_size', 64))
        source_data = SourceData(CLS_DATASETS.build(source_cfg), batch_size,
                                 seed)
    jsonl = osp.join(work_dir, 'progress.jsonl')
    ckpt = model_cfg.get('checkpoint')
    ckpt_id = (ckpt, os.stat(ckpt).st_size, os.stat(ckpt).st_mtime_ns) \
        if ckpt and osp.isfile(ckpt) else ckpt
    results = []
    for spec in specs:
        key = run_key(spec.name, spec.method, spec.bn_batch_stats,
                      model_cfg, data_cfg, scenario_cfg, seed,
                      data.fingerprint(), ckpt_id, source_cfg,
                      source_data.dataset.fingerprint()
                      if source_data else None)
        results.append(run_row(
            spec, source, classifier, stages, data, seed=seed,
            device=get('device', 'cpu'),
            num_workers=int(get('num_workers', 0)), jsonl=jsonl, key=key,
            resume=resume, log=log,
            log_interval=int(get('log_interval', 0)),
            source_data=source_data))
    title = get('title', '') or scenario_cfg.get('type', '')
    meta = dict(model=model_cfg, data=data_cfg, scenario=scenario_cfg,
                seed=seed, classifier=classifier,
                finished=time.strftime('%Y-%m-%d %H:%M:%S'))
    paths = write_results(work_dir, results, data.names, metric, meta,
                          title=title)
    table = format_table(results, data.names, metric, title)
    if log:
        log('\n' + table)
        log(f'results: {paths["json"]}, {paths["csv"]}')
    return dict(rows=[r.to_dict() for r in results], table=table,
                paths=paths)
