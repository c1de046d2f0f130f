"""Classification through ``tools/test.py``'s run and the one online loop,
on the real configs of ``configs/cls`` with a tiny SmallCNN and a tiny
three-corruption CIFAR-C layout: determinism, restarts per scenario, the
continual state, EATA's source data, the log, resume, bad input, the
paper's table of several runs."""
import json
import os
import os.path as osp
from unittest import mock

import numpy as np
import pytest
import torch
from cls_helpers import (CIFAR, IMAGENET, REPO, assert_same_run,
                         killable_config, numbers, options, run, run_tool)
from seg_helpers import python_path

from mmseg_stag.classification import SHORT_NAMES
from mmseg_stag.classification.corruption_table import (
    format_corruption_table, read_corruption_row, write_corruption_table)
from mmseg_stag.core import EATA
from mmseg_stag.engine import OnlineAdaptationLoop


def per_corruption(results):
    """``[correct, total]``, acc and err per corruption of a run."""
    return results['details']['per_corruption']


def test_tent_stag_runs_and_logs(tmp_path, stream, names, checkpoint):
    _, root = stream
    opts = options(root, names)
    a = run(CIFAR.format('tent-stag'), checkpoint, tmp_path / 'a', opts)
    details = a['details']
    assert (a['schema'], a['task'], a['score_name']) == (
        2, 'classification', 'acc') and details['table_metric'] == 'err'
    assert [s['condition'] for s in a['stages']] == list(names)
    assert [s['num_images'] for s in a['stages']] == [40] * 3
    assert {c: v['total'] for c, v in details['per_corruption'].items()} \
        == {c: 40 for c in names}
    assert details['acc_mean_over_corruptions'] == pytest.approx(np.mean(
        [v['acc'] for v in details['per_corruption'].values()]))
    # one stage per corruption here: the means over stages and corruptions
    # agree, and pooled over images too (the same count per corruption)
    assert a['mean_over_stages'] == pytest.approx(
        details['acc_mean_over_corruptions'])
    assert details['acc_pooled_over_images'] == pytest.approx(
        a['mean_over_stages'])
    b = run(CIFAR.format('tent-stag'), checkpoint, tmp_path / 'b', opts)
    assert numbers(a) == numbers(b)  # deterministic
    log = open(next((tmp_path / 'a').rglob('*.log'))).read()
    for key in (' loss:', 'loss_stag:', 'beta:', 'eta:'):
        assert key in log, key
    assert (tmp_path / 'a' / 'continual_acc.png').stat().st_size > 0
    assert (tmp_path / 'a' / 'online_adaptation_state.pth').is_file()


@pytest.mark.parametrize('scenario,restarts', [('mild', 3),
                                               ('continual', 1),
                                               ('mixed', 1)])
def test_restarts_per_scenario(tmp_path, stream, names, checkpoint,
                               monkeypatch, scenario, restarts):
    _, root = stream
    calls = []
    real = OnlineAdaptationLoop.restart_from_source
    monkeypatch.setattr(OnlineAdaptationLoop, 'restart_from_source',
                        lambda self, stage: calls.append(stage) or
                        real(self, stage))
    res = run(CIFAR.format('tent-stag'), checkpoint, tmp_path, options(
        root, names, scenario=scenario))
    assert len(calls) == restarts
    assert sum(v['total'] for v in per_corruption(res).values()) == 120


def test_continual_carries_the_adapted_state(tmp_path, stream, names,
                                             checkpoint):
    _, root = stream
    opts = options(root, names, batch_size=8,
                   **{'test_cfg.method.optimizer': dict(
                       _delete_=True, type='SGD', lr=5.0)})
    cont = run(CIFAR.format('tent'), checkpoint, tmp_path / 'c', opts)
    fresh = run(CIFAR.format('tent'), checkpoint, tmp_path / 'f', dict(
        opts, **{'test_dataloader.dataset.scenario': dict(
            type='per_corruption', order='file')}))
    first = names[0]
    assert per_corruption(cont)[first] == per_corruption(fresh)[first]
    assert [per_corruption(cont)[c] for c in names[1:]] != \
        [per_corruption(fresh)[c] for c in names[1:]]


def test_source_and_bn_adapt(tmp_path, stream, names, checkpoint):
    _, root = stream
    opts = options(root, names, batch_size=40)
    del opts['test_cfg.method.optimizer']
    src = run(CIFAR.format('source'), checkpoint, tmp_path / 's', opts)
    bn = run(CIFAR.format('bn-adapt'), checkpoint, tmp_path / 'b', opts)
    assert per_corruption(src) != per_corruption(bn)


def source_images(tmp_path):
    rng = np.random.default_rng(1)
    np.save(tmp_path / 'x.npy', rng.integers(0, 256, (40, 32, 32, 3),
                                             dtype=np.uint8))
    np.save(tmp_path / 'y.npy', rng.integers(0, 4, 40))
    return {'test_cfg.source_dataloader.batch_size': 16,
            'test_cfg.source_dataloader.num_workers': 0,
            'test_cfg.source_dataloader.dataset.images': dict(
                _delete_=True, type='NumpyImages',
                images=str(tmp_path / 'x.npy'),
                labels=str(tmp_path / 'y.npy'))}


def test_eata_gets_its_fisher_from_the_source_data(tmp_path, stream, names,
                                                   checkpoint, monkeypatch):
    _, root = stream
    opts = options(root, names, **{'test_cfg.method.entropy_margin': 1.0})
    # the ImageNet config's clean images are not there: named at build
    with pytest.raises(FileNotFoundError, match='data/imagenet/val'):
        run(IMAGENET.format('eata'), checkpoint, tmp_path / 'x', opts)
    opts.update(source_images(tmp_path))
    fits = []
    real = EATA.fit_source

    def spy(self, batches):
        batches = list(batches)
        fits.append([len(b.inputs) for b in batches])
        real(self, batches)
        assert self.fishers and all(f.sum() > 0
                                    for f, _ in self.fishers.values())

    monkeypatch.setattr(EATA, 'fit_source', spy)
    a = run(IMAGENET.format('eata'), checkpoint, tmp_path / 'a', opts)
    monkeypatch.undo()
    # one Fisher over every batch; each restart (mild: one per corruption)
    # is back at the source weights and reuses it
    assert fits == [[16, 16, 8]]
    b = run(IMAGENET.format('eata'), checkpoint, tmp_path / 'b', opts)
    assert per_corruption(a) == per_corruption(b)
    # computing it again at every restart gives the same numbers
    monkeypatch.setattr(EATA, 'source_statistics', lambda self: None)
    again = run(IMAGENET.format('eata'), checkpoint, tmp_path / 'd', opts)
    monkeypatch.undo()
    assert per_corruption(again) == per_corruption(a)
    # ETA needs no source data
    run(IMAGENET.format('eata'), checkpoint, tmp_path / 'c', dict(
        options(root, names), **{'test_cfg.method.fisher_alpha': 0,
                                 'test_cfg.source_dataloader': None}))


def test_bad_input_fails_before_the_first_batch(tmp_path, stream, names,
                                                checkpoint):
    _, root = stream
    opts = options(root, names)
    with pytest.raises(FileNotFoundError, match="corruption 'fog'"):
        run(CIFAR.format('tent'), checkpoint, tmp_path / 'a', dict(
            opts, **{'test_dataloader.dataset.corruptions': ['fog']}))
    labels = np.load(osp.join(root, 'labels.npy'))
    np.save(osp.join(root, 'labels.npy'), np.full_like(labels, -1))
    with pytest.raises(ValueError, match='needs the labels'):
        run(CIFAR.format('tent'), checkpoint, tmp_path / 'b', options(
            root, names, scenario='label-shift'))
    np.save(osp.join(root, 'labels.npy'), labels)
    with pytest.raises(ValueError, match='test_cfg.task'):
        run(CIFAR.format('tent'), checkpoint, tmp_path / 'c', dict(
            opts, **{'test_cfg.task': 'segmentation'}))
    for path in (tmp_path / 'a', tmp_path / 'b', tmp_path / 'c'):
        assert not (path / 'continual_results.json').exists()


def test_table_of_several_runs(tmp_path, stream, names, checkpoint):
    _, root = stream
    opts = options(root, names, batch_size=40)
    rows = []
    for name, leaf, base in (('Source', 'source', None), ('TENT', 'tent',
                                                          None),
                             ('TENT+STAG', 'tent-stag', 'TENT')):
        o = dict(opts)
        if leaf == 'source':
            del o['test_cfg.method.optimizer']
        run(CIFAR.format(leaf), checkpoint, tmp_path / leaf, o)
        rows.append(read_corruption_row(str(tmp_path / leaf), name, base))
    table = format_corruption_table(rows, names, 'err', 'Continual',
                                    SHORT_NAMES)
    lines = table.splitlines()
    assert 'Gauss.' in lines[0] and 'Avg.' in lines[0] and 'Gain' in lines[0]
    assert [ln.split()[0] for ln in lines[2:]] == ['Source', 'TENT',
                                                   'TENT+STAG']
    gain = -(rows[2]['avg_err'] - rows[1]['avg_err'])  # error: base - stag
    assert lines[-1].split()[-1] == f'{gain:+.2f}'
    paths = write_corruption_table(str(tmp_path / 'out'), rows, names, 'err')
    csv_rows = open(paths['csv']).read().splitlines()
    assert csv_rows[0].startswith('method,gaussian_noise')
    assert len(csv_rows) == 4
    assert json.load(open(paths['json']))['rows'][2]['name'] == 'TENT+STAG'
    assert open(paths['png'], 'rb').read()[:4] == b'\x89PNG'


def test_run_cached_reuses_a_row_of_the_same_identity(
        tmp_path, stream, names, checkpoint, tiny_model, monkeypatch):
    """``run_cached`` reuses a finished row only for the online loop's
    resume identity: the same settings (but ``RESUME_IGNORES``) and the
    same starting weights; another setting or checkpoint runs it again."""
    from mmengine.config import Config

    from mmseg_stag.engine import runs
    _, root = stream
    cfg = Config.fromfile(CIFAR.format('tent'))
    cfg.merge_from_dict(options(root, names))
    monkeypatch.setattr(runs, 'run_test', mock.Mock(wraps=runs.run_test))
    work = str(tmp_path / 'row')
    first = runs.run_cached(cfg, checkpoint, work)
    assert runs.run_test.call_count == 1
    same = cfg.copy()  # what a resumed run may change too
    same.merge_from_dict({'default_hooks.logger.interval': 5,
                          'log_level': 'WARNING'})
    assert runs.run_cached(same, checkpoint, work) == first
    assert runs.run_test.call_count == 1
    other = cfg.copy()
    other.merge_from_dict({'test_cfg.method.optimizer.lr': 1e-3})
    runs.run_cached(other, checkpoint, work)
    assert runs.run_test.call_count == 2
    torch.save({'state_dict': tiny_model(seed=1).state_dict()}, checkpoint)
    runs.run_cached(other, checkpoint, work)
    assert runs.run_test.call_count == 3
    runs.run_cached(other, checkpoint, work)
    assert runs.run_test.call_count == 3


def test_demo_config_runs_on_the_demo_layout(tmp_path, names):
    from mmseg_stag.classification import CLS_MODELS
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
    res = run(osp.join(REPO, 'configs/cls/demo/mnist-c_mild_cnn-gn_tent-'
                       'stag.py'), ckpt, tmp_path / 'work', {
        'test_dataloader.dataset.corruption_set.data_root': root,
        'test_dataloader.dataset.corruptions': list(names[:2])})
    assert list(per_corruption(res)) == list(names[:2])


# --------------------------------------------- tools/test.py, processes
@pytest.mark.parametrize('method,scenario', [
    ('tent-stag', None), ('cotta', None), ('tent', 'per_corruption')])
def test_killed_run_resumes_to_the_same_numbers(tmp_path, stream, names,
                                                checkpoint, method, scenario):
    """A continual run killed in its third stage continues from the state
    saved after the second: the same results and the same adapted
    parameters, bit for bit, as the uninterrupted run; with a restart from
    the source at every stage, the same count of updates too (the methods
    the restarts replaced counted theirs)."""
    _, root = stream
    opts = options(root, names, batch_size=8, scenario=scenario)
    if method == 'cotta':
        opts.update({'test_cfg.method.restore_prob': 0.3,
                     'test_cfg.method.num_augs': 2})
    env = dict(os.environ, PYTHONPATH=python_path(
        osp.join(REPO, 'tests'), REPO))
    config = killable_config(CIFAR.format(method), opts, tmp_path)
    whole, cut = tmp_path / 'whole', tmp_path / 'cut'
    for work in (whole, cut):
        os.makedirs(work)
    proc = run_tool(config, checkpoint, '--work-dir', str(whole),
                    '--save-adapted', str(whole / 'adapted.pth'), env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    killed = run_tool(config, checkpoint, '--work-dir', str(cut),
                      env=dict(env, KILL_AT_STAGE='2,3'))
    assert killed.returncode != 0
    state = torch.load(cut / 'online_adaptation_state.pth',
                       weights_only=True)
    assert state['batches_done'] == 10  # two stages of 5 batches
    resumed = run_tool(config, checkpoint, '--work-dir', str(cut),
                       '--resume', '--save-adapted',
                       str(cut / 'adapted.pth'), env=env)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert_same_run(whole, cut)
    with open(cut / 'continual_results.json') as f:
        assert json.load(f)['num_updates'] == 15  # 3 stages of 5 batches
