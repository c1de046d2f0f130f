"""Classification runner: online runs (determinism, resets, resume, EATA's
source data), the report (table and files) and the experiment driven by
``tools/test_cls.py`` on configs of ``configs/cls``."""
import json
import os
import os.path as osp

import numpy as np
import pytest
import torch

from mmseg_stag.classification import (CLS_MODELS, NumpyImages, RowSpec,
                                       SourceData, build_stream,
                                       format_table, rows_from_config,
                                       run_row, write_results)
from mmseg_stag.classification import runner as runner_mod
from mmseg_stag.core import EATA
from tools import test_cls

REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
TENT = dict(type='tent', optimizer=dict(type='Adam', lr=1e-2))
STAG = dict(beta0=5.0, gamma=10.0)


# ------------------------------------------------------------------ runner
def test_runner_is_deterministic(stream, tiny_model):
    data, _ = stream
    stages = build_stream(dict(type='mild', batch_size=16), data, 0)
    spec = rows_from_config(TENT, STAG, rows=['stag'])[0]
    model = tiny_model()
    r1 = run_row(spec, model, 'fc', stages, data, seed=0, log=None)
    r2 = run_row(spec, model, 'fc', stages, data, seed=0, log=None)
    assert r1.to_dict()['per_corruption'] == r2.to_dict()['per_corruption']
    assert r1.num_updates == 9  # 3 batches x 3 corruptions
    # the source model itself is never modified
    torch.testing.assert_close(model.state_dict(), tiny_model().state_dict())


def test_runner_resets_per_scenario(stream, names, tiny_model, monkeypatch):
    data, _ = stream
    calls = []
    real = runner_mod.prepare
    monkeypatch.setattr(runner_mod, 'prepare',
                        lambda *a, **k: calls.append(1) or real(*a, **k))
    spec = rows_from_config(TENT, STAG, rows=['stag'])[0]
    model = tiny_model()
    for scenario, expected in (('mild', 3), ('continual', 1), ('mixed', 1)):
        calls.clear()
        stages = build_stream(dict(type=scenario, batch_size=16), data, 0)
        run_row(spec, model, 'fc', stages, data, seed=0, log=None)
        assert len(calls) == expected, scenario
    # mild: every corruption starts from the source, so a corruption gives
    # the same numbers alone as inside the stream
    mild = build_stream(dict(type='mild', batch_size=16), data, 0)
    full = run_row(spec, model, 'fc', mild, data, seed=0, log=None)
    alone = run_row(spec, model, 'fc', mild[2:], data, seed=0, log=None)
    assert alone.correct[names[2]] == full.correct[names[2]]


def test_continual_carries_the_adapted_state(stream, names, tiny_model):
    data, _ = stream
    spec = RowSpec('TENT', dict(TENT, optimizer=dict(type='SGD', lr=5.0)),
                   bn_batch_stats=True)
    model = tiny_model()
    cont = build_stream(dict(type='continual', batch_size=8), data, 0)
    mild = build_stream(dict(type='per_corruption', batch_size=8,
                             order='file'), data, 0)
    a = run_row(spec, model, 'fc', cont, data, seed=0, log=None)
    b = run_row(spec, model, 'fc', mild, data, seed=0, log=None)
    assert a.correct[names[0]] == b.correct[names[0]]
    assert [a.correct[c] for c in names[1:]] != \
        [b.correct[c] for c in names[1:]]


def test_bn_batch_stats_and_source_rows(stream, tiny_model):
    data, _ = stream
    stages = build_stream(dict(type='mild', batch_size=40), data, 0)
    model = tiny_model()
    specs = rows_from_config(dict(type='bn_adapt'), None,
                             rows=['source', 'base'])
    src, bn = [run_row(s, model, 'fc', stages, data, log=None)
               for s in specs]
    assert src.num_updates == 0 and bn.num_updates == 0
    assert src.name == 'Source' and bn.name == 'BN Adapt'
    assert src.to_dict() != bn.to_dict()
    with pytest.raises(ValueError, match='needs a `stag'):
        rows_from_config(TENT, None, rows=['stag'])
    with pytest.raises(ValueError, match='top-level `stag`'):
        rows_from_config(dict(TENT, stag=STAG))


def test_jsonl_progress_and_resume(tmp_path, stream, names, tiny_model):
    data, _ = stream
    jsonl = str(tmp_path / 'progress.jsonl')
    spec = rows_from_config(TENT, STAG, rows=['stag'])[0]
    model = tiny_model()
    mild = build_stream(dict(type='mild', batch_size=16), data, 0)
    first = run_row(spec, model, 'fc', mild, data, jsonl=jsonl, key='k1',
                    log=None)
    records = [json.loads(line) for line in open(jsonl)]
    assert [r['corruption'] for r in records] == list(names)
    assert sum(r['total'] for r in records) == len(data)
    again = run_row(spec, model, 'fc', mild, data, jsonl=jsonl, key='k1',
                    resume=True, log=None)
    assert again.skipped_stages == 3
    assert again.to_dict()['per_corruption'] == \
        first.to_dict()['per_corruption']
    assert again.num_updates == first.num_updates
    # continual: the run state saved after every stage lets every recorded
    # stage be skipped (without it, only the last: see below)
    cont = build_stream(dict(type='continual', batch_size=16), data, 0)
    run_row(spec, model, 'fc', cont, data, jsonl=jsonl, key='k2', log=None)
    with open(jsonl, 'a') as f:
        f.write('{"key": "k2", "cut')  # a line cut by a crash
    res = run_row(spec, model, 'fc', cont, data, jsonl=jsonl, key='k2',
                  resume=True, log=None)
    assert res.skipped_stages == 3
    os.remove(runner_mod.state_path(jsonl, 'k2'))
    res = run_row(spec, model, 'fc', cont, data, jsonl=jsonl, key='k2',
                  resume=True, log=None)
    assert res.skipped_stages == 1


def test_eata_gets_its_fisher_from_the_source_data(tmp_path, stream,
                                                   tiny_model, monkeypatch):
    data, _ = stream
    stages = build_stream(dict(type='mild', batch_size=16), data, 0)
    spec = RowSpec('EATA', dict(type='eata', entropy_margin=1.0,
                                optimizer=dict(type='SGD', lr=0.1)),
                   bn_batch_stats=True)
    with pytest.raises(ValueError, match='source_data'):
        run_row(spec, tiny_model(), 'fc', stages, data, log=None)

    rng = np.random.default_rng(1)
    np.save(tmp_path / 'x.npy', rng.integers(0, 256, (40, 32, 32, 3),
                                             dtype=np.uint8))
    np.save(tmp_path / 'y.npy', rng.integers(0, 4, 40))
    source = SourceData(NumpyImages(str(tmp_path / 'x.npy'),
                                    str(tmp_path / 'y.npy')), batch_size=16)
    fits = []
    real = EATA.fit_source

    def spy(self, forward, batches):
        batches = list(batches)
        fits.append([len(b) for b in batches])
        real(self, forward, batches)
        assert self.fishers and all(f.sum() > 0
                                    for f, _ in self.fishers.values())

    monkeypatch.setattr(EATA, 'fit_source', spy)
    a = run_row(spec, tiny_model(), 'fc', stages, data, log=None,
                source_data=source)
    monkeypatch.undo()
    # one Fisher per reset (mild: one per corruption), over every batch
    assert fits == [[16, 16, 8]] * 3
    b = run_row(spec, tiny_model(), 'fc', stages, data, log=None,
                source_data=source)
    assert a.to_dict()['per_corruption'] == b.to_dict()['per_corruption']
    # ETA needs no source data
    eta = RowSpec('ETA', dict(spec.method, fisher_alpha=0),
                  bn_batch_stats=True)
    run_row(eta, tiny_model(), 'fc', stages, data, log=None)


# ------------------------------------------------------------------ report
def test_table_and_files(tmp_path, stream, tiny_model):
    data, _ = stream
    stages = build_stream(dict(type='mild', batch_size=40), data, 0)
    specs = rows_from_config(TENT, STAG, rows=['source', 'base', 'stag'])
    res = [run_row(s, tiny_model(), 'fc', stages, data, log=None)
           for s in specs]
    table = format_table(res, data.names, 'err', 'Continual')
    lines = table.splitlines()
    assert 'Gauss.' in lines[0] and 'Avg.' in lines[0] and 'Gain' in lines[0]
    assert [ln.split()[0] for ln in lines[2:]] == ['Source', 'TENT',
                                                   'TENT+STAG']
    gain = res[1].avg_acc - res[2].avg_acc  # error gain = base - stag
    assert lines[-1].split()[-1] == f'{-gain:+.2f}'
    paths = write_results(str(tmp_path / 'out'), res, data.names, 'err')
    rows = open(paths['csv']).read().splitlines()
    assert rows[0].startswith('method,gaussian_noise')
    assert len(rows) == 4
    saved = json.load(open(paths['json']))
    assert saved['rows'][2]['name'] == 'TENT+STAG'


# ------------------------------------- the experiment (tools/test_cls.py)
def test_tool_end_to_end(tmp_path, stream, names, tiny_model):
    data, root = stream
    ckpt = str(tmp_path / 'tiny.pth')
    torch.save({'state_dict': tiny_model().state_dict(), 'meta': {}}, ckpt)
    work = str(tmp_path / 'work')
    args = [
        osp.join(REPO, 'configs/cls/cifar-c/cifar10-c_continual_wrn-28-10_'
                 'tent.py'), '--work-dir', work, '--data-root', root,
        '--checkpoint', ckpt, '--cfg-options', 'model.type=SmallCNN',
        'model.num_classes=4', 'model.width=4', 'scenario.batch_size=16',
        'data.n_examples=32', f'data.corruptions={list(names)}',
        'num_workers=0', 'log_interval=1'
    ]
    test_cls.main(args)
    saved = json.load(open(osp.join(work, 'results.json')))
    assert [r['name'] for r in saved['rows']] == ['TENT', 'TENT+STAG']
    assert saved['rows'][0]['per_corruption'][names[0]]['total'] == 32
    assert saved['metric'] == 'err'
    lines = open(osp.join(work, 'progress.jsonl')).read().splitlines()
    assert len(lines) == 6
    test_cls.main(args + ['--resume'])
    with pytest.raises(SystemExit, match='not found'):
        test_cls.main(args[:1] + ['--work-dir', work, '--data-root',
                                  str(tmp_path / 'none')] + args[7:])


def test_demo_config_runs_on_demo_layout(tmp_path, names):
    root = str(tmp_path / 'MNIST-C')
    os.makedirs(root)
    rng = np.random.default_rng(0)
    np.save(osp.join(root, 'labels.npy'), rng.integers(0, 10, 20))
    for c in names[:2]:
        np.save(osp.join(root, f'{c}.npy'),
                rng.integers(0, 256, (20, 32, 32, 3), dtype=np.uint8))
    ckpt = str(tmp_path / 'gn.pth')
    torch.save({'state_dict': CLS_MODELS.build(dict(
        type='SmallCNN', norm='GN', width=16, groups=4)).state_dict()}, ckpt)
    work = str(tmp_path / 'work')
    test_cls.main([
        osp.join(REPO, 'configs/cls/demo/mnist-c_mild_cnn-gn_tent.py'),
        '--work-dir', work, '--data-root', root, '--checkpoint', ckpt,
        '--cfg-options', f'data.corruptions={list(names[:2])}'
    ])
    saved = json.load(open(osp.join(work, 'results.json')))
    assert [r['name'] for r in saved['rows']] == ['Source', 'TENT',
                                                  'TENT+STAG']


class Crash(Exception):
    pass


class CrashingData:
    """The stream's data, raising at the ``at``-th loaded batch (a crash
    mid-stage)."""

    def __init__(self, data, at):
        self.data, self.at, self.loaded = data, at, 0

    def __getattr__(self, name):
        return getattr(self.data, name)

    def load(self, batch):
        self.loaded += 1
        if self.loaded == self.at:
            raise Crash
        return self.data.load(batch)


@pytest.mark.parametrize('method', [
    dict(TENT, stag=STAG),
    dict(type='cotta', optimizer=dict(type='SGD', lr=0.5), restore_prob=0.3,
         num_augs=2, ap=0.9)])
def test_continual_row_resumes_mid_stream(tmp_path, stream, tiny_model,
                                          method):
    """A continual row killed in its third stage continues from the state
    saved after the second: same counts and same final state (CoTTA's
    teacher and random restores included) as the uninterrupted row."""
    data, _ = stream
    spec = RowSpec('X', method, bn_batch_stats=True)
    cont = build_stream(dict(type='continual', batch_size=8), data, 0)
    assert len(cont) == 3 and not any(s.reset for s in cont[1:])
    whole = str(tmp_path / 'whole' / 'progress.jsonl')
    os.makedirs(osp.dirname(whole))
    expected = run_row(spec, tiny_model(), 'fc', cont, data, jsonl=whole,
                       key='k', log=None)
    cut = str(tmp_path / 'cut' / 'progress.jsonl')
    os.makedirs(osp.dirname(cut))
    per_stage = len(cont[0].batches)
    with pytest.raises(Crash):
        run_row(spec, tiny_model(), 'fc', cont,
                CrashingData(data, 2 * per_stage + 2), jsonl=cut, key='k',
                log=None)
    assert torch.load(runner_mod.state_path(cut, 'k'),
                      weights_only=True)['stage'] == 1
    got = run_row(spec, tiny_model(), 'fc', cont, data, jsonl=cut, key='k',
                  resume=True, log=None)
    assert got.skipped_stages == 2
    assert got.to_dict()['per_corruption'] == \
        expected.to_dict()['per_corruption']
    assert got.num_updates == expected.num_updates
    a, b = [torch.load(runner_mod.state_path(p, 'k'),
                       weights_only=True)['method'] for p in (whole, cut)]
    for part in ('model', 'teacher') if 'teacher' in a else ('model', ):
        for name in a[part]:
            assert torch.equal(a[part][name], b[part][name]), name


def test_corrupt_row_state_is_refused(tmp_path, stream, tiny_model):
    data, _ = stream
    spec = rows_from_config(TENT, STAG, rows=['stag'])[0]
    cont = build_stream(dict(type='continual', batch_size=16), data, 0)
    jsonl = str(tmp_path / 'progress.jsonl')
    run_row(spec, tiny_model(), 'fc', cont, data, jsonl=jsonl, key='k',
            log=None)
    path = runner_mod.state_path(jsonl, 'k')
    with open(path, 'r+b') as f:
        f.truncate(100)
    with pytest.raises(RuntimeError, match='corrupt or truncated'):
        run_row(spec, tiny_model(), 'fc', cont, data, jsonl=jsonl, key='k',
                resume=True, log=None)
