"""Classification runner: classifier detection, the one-pass forward,
scenario builders, online runs (determinism, resets, resume), the
RobustBench WideResNets, weight loading, configs and tools/test_cls.py."""
import json
import os
import os.path as osp
import sys
import types

import numpy as np
import pytest
import torch
import torch.nn as nn

import mmseg_stag  # noqa: F401
from mmseg_stag.classification import (CLS_MODELS, CORRUPTIONS, RowSpec,
                                       SmallCNN, SmallViT, StreamData,
                                       build_cls_model,
                                       build_corruption_sets, build_stream,
                                       find_classifier, format_table,
                                       load_weights, make_forward,
                                       rows_from_config, run_row,
                                       wrn28_10_standard, wrn40_2_augmix,
                                       write_results)
from mmseg_stag.classification import runner as runner_mod
from mmseg_stag.classification.paper_configs import (leaf_configs,
                                                     paper_stag,
                                                     write_configs)


REPO = osp.dirname(osp.dirname(osp.abspath(__file__)))
NAMES = ('gaussian_noise', 'shot_noise', 'impulse_noise')


# ---------------------------------------------------------------- helpers
class TwoHeads(nn.Module):
    """An auxiliary Linear before the classifier, and a call counter."""

    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4),
                                  nn.ReLU())
        self.proj = nn.Linear(4, 6)
        self.cls = nn.Linear(6, 3)
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        return self.cls(torch.relu(self.proj(self.body(x).mean((2, 3)))))


def tiny_stream_data(tmp_path, n=40):
    """Three corruptions of ``n`` 32x32 images; the class is visible in the
    mean intensity so that a model can be good or bad."""
    root = str(tmp_path / 'cifar-c')
    os.makedirs(root, exist_ok=True)
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 4, n)
    np.save(osp.join(root, 'labels.npy'), np.tile(labels, 5))
    for k, c in enumerate(NAMES):
        base = (labels[:, None, None, None] * 50 + 30).astype(np.float64)
        noise = rng.normal(0, 20 + 20 * k, (5 * n, 32, 32, 3))
        arr = np.clip(np.tile(base, (5, 32, 32, 3)) + noise, 0, 255)
        np.save(osp.join(root, f'{c}.npy'), arr.astype(np.uint8))
    sets = build_corruption_sets(dict(type='CIFARC', data_root=root,
                                      corruptions=list(NAMES)))
    return StreamData(sets), root


def tiny_model(seed=0):
    torch.manual_seed(seed)
    model = SmallCNN(num_classes=4, width=4, norm='BN')
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.uniform_(-0.2, 0.2)
            m.running_var.uniform_(0.5, 1.5)
    return model.eval()


TENT = dict(type='tent', optimizer=dict(type='Adam', lr=1e-2))
STAG = dict(beta0=5.0, gamma=10.0)


# ----------------------------------------------------- classifier, forward
def test_find_classifier_auto_and_named():
    model = TwoHeads()
    name, module = find_classifier(model)
    assert name == 'cls' and module is model.cls
    assert find_classifier(model, 'proj')[1] is model.proj
    with pytest.raises(ValueError, match=r"no module 'head'.*'proj', 'cls'"):
        find_classifier(model, 'head')
    with pytest.raises(ValueError, match='weight'):
        find_classifier(model, 'body.2')
    with pytest.raises(ValueError, match='no nn.Linear'):
        find_classifier(nn.Sequential(nn.Conv2d(3, 3, 1)))
    assert find_classifier(SmallViT())[0] == 'head'
    assert find_classifier(wrn40_2_augmix())[0] == 'fc'


def test_forward_returns_the_classifier_input_in_one_pass():
    model = TwoHeads().eval()
    forward = make_forward('cls')
    x = torch.randn(5, 3, 8, 8)
    logits, outs = forward(model, x)
    assert model.calls == 1
    (features, head_logits), = outs
    assert features.shape == (5, 6) and head_logits is logits
    torch.testing.assert_close(model.cls(features), logits, rtol=0, atol=0)
    assert not model.cls._forward_hooks  # the hook is removed
    # the features keep their graph: a loss on them reaches the BN affine
    features.sum().backward()
    assert model.body[1].weight.grad is not None


def test_forward_rejects_spatial_features():
    model = nn.Sequential(nn.Conv2d(3, 4, 1), nn.Conv2d(4, 2, 1))
    with pytest.raises(ValueError, match=r'\[N, D\]'):
        make_forward('1')(model, torch.randn(1, 3, 2, 2))


# ---------------------------------------------------------------- scenarios
def test_label_shift_stream_is_sorted_by_class(tmp_path):
    data, _ = tiny_stream_data(tmp_path)
    stages = build_stream(dict(type='label_shift', batch_size=7), data, 3)
    assert [s.name for s in stages] == list(NAMES)
    assert all(s.reset for s in stages)
    for s in stages:
        idx = np.concatenate(s.batches)
        np.testing.assert_array_equal(np.sort(idx), data.indices_of(s.name))
        labels = data.labels[idx]
        # each class forms one contiguous run (imbalance ratio inf)
        runs = labels[np.r_[True, labels[1:] != labels[:-1]]]
        assert len(runs) == len(set(labels.tolist()))
    again = build_stream(dict(type='label_shift', batch_size=7), data, 3)
    assert all(np.array_equal(a, b) for a, b in
               zip(stages[0].batches, again[0].batches))
    plain = build_stream(dict(type='label_shift', batch_size=7,
                              shuffle_class_order=False), data, 3)
    lab = data.labels[np.concatenate(plain[0].batches)]
    assert np.all(np.diff(lab) >= 0)


def test_mild_and_mixed_streams_are_seeded_shuffles(tmp_path):
    data, _ = tiny_stream_data(tmp_path)
    a = build_stream(dict(type='mild', batch_size=16), data, seed=1)
    b = build_stream(dict(type='mild', batch_size=16), data, seed=1)
    c = build_stream(dict(type='mild', batch_size=16), data, seed=2)
    flat = [np.concatenate(s.batches) for s in a]
    assert [len(x) for x in a[0].batches] == [16, 16, 8]
    assert all(np.array_equal(x, np.concatenate(y.batches))
               for x, y in zip(flat, b))
    assert not np.array_equal(flat[0], np.concatenate(c[0].batches))
    assert not np.array_equal(flat[0], data.indices_of(NAMES[0]))
    mixed = build_stream(dict(type='mixed', batch_size=64), data, seed=1)
    assert len(mixed) == 1 and mixed[0].name == 'mixed'
    idx = np.concatenate(mixed[0].batches)
    np.testing.assert_array_equal(np.sort(idx), np.arange(len(data)))
    # corruptions are interleaved, not in blocks
    assert len(set(data.domain[idx[:20]].tolist())) > 1
    again = build_stream(dict(type='mixed', batch_size=64), data, seed=1)
    np.testing.assert_array_equal(idx, np.concatenate(again[0].batches))


def test_continual_and_bs1_streams(tmp_path):
    data, _ = tiny_stream_data(tmp_path)
    cont = build_stream(dict(type='continual', batch_size=16), data, 0)
    assert [s.name for s in cont] == list(NAMES)
    assert [s.reset for s in cont] == [True, False, False]
    np.testing.assert_array_equal(np.concatenate(cont[1].batches),
                                  data.indices_of(NAMES[1]))
    bs1 = build_stream(dict(type='batch_size_1'), data, 0)
    assert all(len(b) == 1 for s in bs1 for b in s.batches)
    assert all(s.reset for s in bs1)


# ------------------------------------------------------------------ runner
def test_runner_is_deterministic(tmp_path):
    data, _ = tiny_stream_data(tmp_path)
    stages = build_stream(dict(type='mild', batch_size=16), data, 0)
    spec = rows_from_config(TENT, STAG, rows=['stag'])[0]
    model = tiny_model()
    r1 = run_row(spec, model, 'fc', stages, data, seed=0, log=None)
    r2 = run_row(spec, model, 'fc', stages, data, seed=0, log=None)
    assert r1.to_dict()['per_corruption'] == r2.to_dict()['per_corruption']
    assert r1.num_updates == 9  # 3 batches x 3 corruptions
    # the source model itself is never modified
    torch.testing.assert_close(model.state_dict(), tiny_model().state_dict())


def test_runner_resets_per_scenario(tmp_path, monkeypatch):
    data, _ = tiny_stream_data(tmp_path)
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
    assert alone.correct[NAMES[2]] == full.correct[NAMES[2]]


def test_continual_carries_the_adapted_state(tmp_path):
    data, _ = tiny_stream_data(tmp_path)
    spec = RowSpec('TENT', dict(TENT, optimizer=dict(type='SGD', lr=5.0)),
                   bn_batch_stats=True)
    model = tiny_model()
    cont = build_stream(dict(type='continual', batch_size=8), data, 0)
    mild = build_stream(dict(type='per_corruption', batch_size=8,
                             order='file'), data, 0)
    a = run_row(spec, model, 'fc', cont, data, seed=0, log=None)
    b = run_row(spec, model, 'fc', mild, data, seed=0, log=None)
    assert a.correct[NAMES[0]] == b.correct[NAMES[0]]
    assert [a.correct[c] for c in NAMES[1:]] != \
        [b.correct[c] for c in NAMES[1:]]


def test_bn_batch_stats_and_source_rows(tmp_path):
    data, _ = tiny_stream_data(tmp_path)
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


def test_jsonl_progress_and_resume(tmp_path):
    data, _ = tiny_stream_data(tmp_path)
    jsonl = str(tmp_path / 'progress.jsonl')
    spec = rows_from_config(TENT, STAG, rows=['stag'])[0]
    model = tiny_model()
    mild = build_stream(dict(type='mild', batch_size=16), data, 0)
    first = run_row(spec, model, 'fc', mild, data, jsonl=jsonl, key='k1',
                    log=None)
    records = [json.loads(line) for line in open(jsonl)]
    assert [r['corruption'] for r in records] == list(NAMES)
    assert sum(r['total'] for r in records) == len(data)
    again = run_row(spec, model, 'fc', mild, data, jsonl=jsonl, key='k1',
                    resume=True, log=None)
    assert again.skipped_stages == 3
    assert again.to_dict()['per_corruption'] == \
        first.to_dict()['per_corruption']
    assert again.num_updates == first.num_updates
    # continual: only the last stage can be skipped
    cont = build_stream(dict(type='continual', batch_size=16), data, 0)
    run_row(spec, model, 'fc', cont, data, jsonl=jsonl, key='k2', log=None)
    with open(jsonl, 'a') as f:
        f.write('{"key": "k2", "cut')  # a line cut by a crash
    res = run_row(spec, model, 'fc', cont, data, jsonl=jsonl, key='k2',
                  resume=True, log=None)
    assert res.skipped_stages == 1


def test_table_and_files(tmp_path):
    data, _ = tiny_stream_data(tmp_path)
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


# ------------------------------------------------------------ WideResNets
def test_wrn_parameter_names_and_sizes():
    wrn28 = wrn28_10_standard()
    sd = wrn28.state_dict()
    shapes = {
        'conv1.weight': (16, 3, 3, 3),
        'block1.layer.0.bn1.weight': (16, ),
        'block1.layer.0.conv1.weight': (160, 16, 3, 3),
        'block1.layer.0.convShortcut.weight': (160, 16, 1, 1),
        'block2.layer.0.convShortcut.weight': (320, 160, 1, 1),
        'block3.layer.3.conv2.weight': (640, 640, 3, 3),
        'block3.layer.3.bn2.running_var': (640, ),
        'bn1.weight': (640, ),
        'fc.weight': (10, 640),
        'fc.bias': (10, ),
    }
    for key, shape in shapes.items():
        assert tuple(sd[key].shape) == shape, key
    assert 'block1.layer.1.convShortcut.weight' not in sd
    n28 = sum(p.numel() for p in wrn28.parameters())
    assert abs(n28 - 36.5e6) < 0.05e6
    wrn40 = wrn40_2_augmix()
    sd40 = wrn40.state_dict()
    assert tuple(sd40['block1.layer.5.conv2.weight'].shape) == (32, 32, 3, 3)
    assert tuple(sd40['fc.weight'].shape) == (100, 128)
    assert 'mu' not in sd40 and 'sigma' not in sd40
    n40 = sum(p.numel() for p in wrn40.parameters())
    assert abs(n40 - 2.2e6) < 0.1e6
    assert wrn28(torch.rand(2, 3, 32, 32)).shape == (2, 10)


def test_wrn_loads_robustbench_style_files(tmp_path):
    src = wrn40_2_augmix()
    # RobustBench files: DataParallel 'module.' prefixes, no mu/sigma
    state = {f'module.{k}': v for k, v in src.state_dict().items()}
    path = str(tmp_path / 'Hendrycks2020AugMix_WRN.pt')
    torch.save({'state_dict': state, 'epoch': 100}, path)
    model, cls = build_cls_model(dict(type='WRN40_2_AugMix', checkpoint=path))
    assert cls == 'fc'
    x = torch.rand(2, 3, 32, 32)
    torch.testing.assert_close(model(x), src.eval()(x))
    # a file that does hold mu/sigma loads too
    extra = dict(src.state_dict(), mu=torch.zeros(1, 3, 1, 1),
                 sigma=torch.ones(1, 3, 1, 1))
    torch.save(extra, str(tmp_path / 'with_mu.pt'))
    load_weights(wrn40_2_augmix(), str(tmp_path / 'with_mu.pt'))


def test_weight_loading_errors(tmp_path):
    model = SmallCNN(width=4)
    bad = dict(model.state_dict())
    bad.pop('fc.bias')
    bad['extra.weight'] = torch.zeros(1)
    torch.save(bad, str(tmp_path / 'bad.pth'))
    with pytest.raises(ValueError, match=r'missing keys \(1\): fc.bias'):
        load_weights(model, str(tmp_path / 'bad.pth'))
    with pytest.raises(FileNotFoundError, match='nope.pth'):
        load_weights(model, str(tmp_path / 'nope.pth'))
    torch.save({'state_dict': model.state_dict(), 'meta': {'x': object()}},
               str(tmp_path / 'pickled.pth'))
    with pytest.raises(RuntimeError, match='--trust-pickle'):
        load_weights(model, str(tmp_path / 'pickled.pth'))
    load_weights(model, str(tmp_path / 'pickled.pth'),
                 allow_unsafe_pickle=True)


def test_optional_extras(monkeypatch):
    monkeypatch.setitem(sys.modules, 'torchvision', None)
    monkeypatch.setitem(sys.modules, 'torchvision.models', None)
    with pytest.raises(ImportError, match=r'pip install -e \.\[cls\]'):
        build_cls_model(dict(type='TorchvisionResNet50'))
    fake = types.ModuleType('timm')
    fake.create_model = lambda name, pretrained, num_classes: SmallViT(
        num_classes=num_classes)
    monkeypatch.setitem(sys.modules, 'timm', fake)
    model, cls = build_cls_model(dict(type='TimmModel',
                                      model_name='vit_base_patch16_224',
                                      num_classes=7))
    assert cls == 'head' and model.head.out_features == 7


# ----------------------------------------------------- configs and the tool
def test_generated_configs_are_up_to_date():
    assert write_configs(osp.join(REPO, 'configs', 'cls'), check=True) == []


def test_paper_hyper_parameters_in_configs():
    from mmengine.config import Config
    cases = {
        'imagenet-c/imagenet-c_mild_resnet50-bn_tent.py': (100, 100, 2.5e-4),
        'imagenet-c/imagenet-c_mild_resnet50-gn_eata.py': (250, 100, 2.5e-4),
        'imagenet-c/imagenet-c_mild_vit-b16_tent.py': (300, 50, 1e-3),
        'imagenet-c/imagenet-c_bs1_vit-b16_sar.py': (1000, 10000,
                                                     0.001 / 64),
        'cifar-c/cifar10-c_continual_wrn-28-10_bn-adapt.py': (90, 15, 1e-3),
        'cifar-c/cifar10-c_continual_wrn-28-10_tent.py': (100, 10, 1e-3),
        'cifar-c/cifar100-c_continual_wrn-40-2_tent.py': (500, 5, 1e-3),
    }
    for rel, (beta0, gamma, lr) in cases.items():
        cfg = Config.fromfile(osp.join(REPO, 'configs', 'cls', rel))
        assert (cfg.stag.beta0, cfg.stag.gamma) == (beta0, gamma), rel
        assert cfg.method.optimizer.lr == pytest.approx(lr), rel
        assert list(cfg.data.corruptions) == list(CORRUPTIONS)
    assert paper_stag('cifar100-c', 'continual', 'wrn-40-2',
                      'cotta') == dict(beta0=10, gamma=400)
    assert len(leaf_configs()) >= 40


def test_every_cls_config_loads():
    from mmengine.config import Config
    for rel in leaf_configs():
        cfg = Config.fromfile(osp.join(REPO, 'configs', 'cls', rel))
        assert cfg.model.type in CLS_MODELS.module_dict
        assert {'data', 'scenario', 'method', 'rows', 'seed'} <= set(cfg)


def test_tool_end_to_end(tmp_path):
    sys.path.insert(0, osp.join(REPO, 'tools'))
    try:
        import test_cls
    finally:
        sys.path.pop(0)
    data, root = tiny_stream_data(tmp_path)
    ckpt = str(tmp_path / 'tiny.pth')
    torch.save({'state_dict': tiny_model().state_dict(), 'meta': {}}, ckpt)
    work = str(tmp_path / 'work')
    args = [
        osp.join(REPO, 'configs/cls/cifar-c/cifar10-c_continual_wrn-28-10_'
                 'tent.py'), '--work-dir', work, '--data-root', root,
        '--checkpoint', ckpt, '--cfg-options', 'model.type=SmallCNN',
        'model.num_classes=4', 'model.width=4', 'scenario.batch_size=16',
        'data.n_examples=32', f'data.corruptions={list(NAMES)}',
        'num_workers=0', 'log_interval=1'
    ]
    test_cls.main(args)
    saved = json.load(open(osp.join(work, 'results.json')))
    assert [r['name'] for r in saved['rows']] == ['TENT', 'TENT+STAG']
    assert saved['rows'][0]['per_corruption'][NAMES[0]]['total'] == 32
    assert saved['metric'] == 'err'
    lines = open(osp.join(work, 'progress.jsonl')).read().splitlines()
    assert len(lines) == 6
    test_cls.main(args + ['--resume'])
    with pytest.raises(SystemExit, match='not found'):
        test_cls.main(args[:1] + ['--work-dir', work, '--data-root',
                                  str(tmp_path / 'none')] + args[7:])


def test_demo_config_runs_on_demo_layout(tmp_path):
    sys.path.insert(0, osp.join(REPO, 'tools'))
    try:
        import test_cls
    finally:
        sys.path.pop(0)
    root = str(tmp_path / 'MNIST-C')
    os.makedirs(root)
    rng = np.random.default_rng(0)
    np.save(osp.join(root, 'labels.npy'), rng.integers(0, 10, 20))
    for c in NAMES[:2]:
        np.save(osp.join(root, f'{c}.npy'),
                rng.integers(0, 256, (20, 32, 32, 3), dtype=np.uint8))
    ckpt = str(tmp_path / 'gn.pth')
    torch.save({'state_dict': CLS_MODELS.build(dict(
        type='SmallCNN', norm='GN', width=16, groups=4)).state_dict()}, ckpt)
    work = str(tmp_path / 'work')
    test_cls.main([
        osp.join(REPO, 'configs/cls/demo/mnist-c_mild_cnn-gn_tent.py'),
        '--work-dir', work, '--data-root', root, '--checkpoint', ckpt,
        '--cfg-options', f'data.corruptions={list(NAMES[:2])}'
    ])
    saved = json.load(open(osp.join(work, 'results.json')))
    assert [r['name'] for r in saved['rows']] == ['Source', 'TENT',
                                                  'TENT+STAG']


def test_eata_gets_its_fisher_from_the_source_data(tmp_path, monkeypatch):
    from mmseg_stag.classification import NumpyImages, SourceData
    data, _ = tiny_stream_data(tmp_path)
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
    from mmseg_stag.methods import EATA
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
