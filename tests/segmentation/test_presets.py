"""The fast presets (``configs/stag_acdc/*_bf16.py`` and ``*_bf16-graph.py``,
docs/running.md "The fast preset"): what each changes beside its faithful
config, that its name says whether it replays a CUDA graph, and what
a machine without CUDA does with one: it stops before the stream, naming
CUDA; the parts a CPU can run (SDPA attention, token views, bfloat16
autocast) run through ``tools/test.py``'s path, and SDPA with views gives
the faithful run's numbers."""
import glob
import json
import os.path as osp
import uuid

import pytest
import torch
from mmengine.config import Config
from mmengine.runner import Runner

from demo_data import make_acdc_like_tree
from run_helpers import run_config
from seg_helpers import REPO, build_from_config, save_checkpoint, tiny_options

#: a preset's file name ends with what it does: a graph or not
SUFFIXES = ('_bf16.py', '_bf16-graph.py')
PRESETS = sorted(p for suffix in SUFFIXES for p in glob.glob(
    osp.join(REPO, 'configs', 'stag_acdc', '*' + suffix)))
#: the methods whose preset replays their step as a CUDA graph
GRAPHED = ('tent', 'tent-stag', 'cotta', 'cotta-stag')
MISSING = object()


def suffix_of(path: str) -> str:
    return next(s for s in SUFFIXES if path.endswith(s))


def method_of(path: str) -> str:
    return osp.basename(path)[:-len(suffix_of(path))].rsplit('_', 1)[1]


def faithful(path: str) -> str:
    return path[:-len(suffix_of(path))] + '.py'


def flat(value, prefix=''):
    """A config as ``{dotted key: leaf value}`` (lists are leaves)."""
    if not isinstance(value, dict):
        return {prefix[:-1]: value}
    out = {}
    for key, sub in value.items():
        out.update(flat(sub, f'{prefix}{key}.'))
    return out


def test_the_presets_of_table_9_and_cotta():
    assert sorted(method_of(p) for p in PRESETS) == sorted(
        ['source', 'bn-adapt', 'bn-adapt-stag', 'tent', 'tent-stag',
         'cotta', 'cotta-stag'])
    assert all('nvlabs' in osp.basename(p) for p in PRESETS)


@pytest.mark.parametrize('path', PRESETS, ids=osp.basename)
def test_a_preset_is_named_graph_exactly_when_it_replays_one(path):
    graph = Config.fromfile(path).test_cfg.get('cuda_graph', False)
    assert suffix_of(path) == ('_bf16-graph.py' if graph else '_bf16.py')
    assert graph == (method_of(path) in GRAPHED)


@pytest.mark.parametrize('path', PRESETS, ids=osp.basename)
def test_a_preset_changes_its_speed_options_only(path):
    """Method, STAG, data, protocol and metric are the faithful config's:
    the two configs differ in exactly the preset's keys."""
    preset = flat(Config.fromfile(path).to_dict())
    plain = flat(Config.fromfile(faithful(path)).to_dict())
    changed = {k: preset.get(k, MISSING) for k in set(preset) | set(plain)
               if preset.get(k, MISSING) != plain.get(k, MISSING)}
    expected = {'model.backbone.attention': 'sdpa',
                'model.backbone.token_maps': 'view',
                'test_dataloader.num_workers': 8,
                'test_cfg.preset': 'fast',
                'test_cfg.mixed_precision': 'bf16'}
    method = method_of(path)
    if method in GRAPHED:
        expected['test_cfg.cuda_graph'] = True
    if method.startswith('cotta'):
        # a graph replays no host-side draw of the restore mask
        expected.update({'test_cfg.method.restore_on_device': True,
                         'test_cfg.method.batch_views': True})
    assert changed == expected


def tiny_runner(config, tiny_acdc, work_dir, extra=None):
    cfg = Config.fromfile(config)
    cfg.merge_from_dict(dict(tiny_options(tiny_acdc, head='nvlabs'),
                             **(extra or {})))
    cfg.work_dir = str(work_dir)
    cfg.experiment_name = f'preset_{uuid.uuid4().hex[:8]}'
    return Runner.from_cfg(cfg)


@pytest.mark.skipif(torch.cuda.is_available(),
                    reason='a CUDA machine runs the presets (tests/cuda)')
@pytest.mark.parametrize('path', PRESETS, ids=osp.basename)
def test_without_cuda_a_preset_stops_before_the_stream(path, tiny_acdc,
                                                       tmp_path):
    runner = tiny_runner(path, tiny_acdc, tmp_path)
    with pytest.raises(ValueError, match=r"preset='fast' is for a "
                       r'CUDA GPU, and this model is on cpu.*without the '
                       r'_bf16 or _bf16-graph suffix'):
        runner.test()
    assert not list(tmp_path.rglob('continual_results.json'))
    assert not list(tmp_path.rglob('online_adaptation_state.pth'))


@pytest.fixture(scope='module')
def nvlabs_checkpoint(tiny_acdc, tmp_path_factory):
    model, _ = build_from_config(
        osp.relpath(faithful(PRESETS[0]), REPO),
        tiny_options(tiny_acdc, head='nvlabs'))
    return save_checkpoint(
        model, tmp_path_factory.mktemp('nvlabs') / 'tiny_nvlabs.pth')


def stage_scores(results: dict) -> list:
    return [s['score'] for s in results['stages']]


@pytest.mark.parametrize('method', ['source', 'bn-adapt-stag', 'tent-stag'])
def test_the_cpu_parts_of_a_preset_run_through_tools_test(
        method, tiny_acdc, nvlabs_checkpoint, tmp_path):
    """The preset without its CUDA parts (``preset``, ``cuda_graph``): SDPA
    and views give the faithful run's stage scores (float32: equal to
    rounding); bfloat16 autocast runs to the end, finite."""
    path = next(p for p in PRESETS if method_of(p) == method)
    cpu = {'test_cfg.preset': None, 'test_cfg.cuda_graph': False}
    opts = tiny_options(tiny_acdc, head='nvlabs')
    want = run_config(faithful(path), nvlabs_checkpoint, tmp_path / 'plain',
                      opts)
    views = run_config(path, nvlabs_checkpoint, tmp_path / 'views', dict(
        opts, **cpu, **{'test_cfg.mixed_precision': None}))
    assert len(stage_scores(views)) == len(stage_scores(want)) == 8
    assert stage_scores(views) == pytest.approx(stage_scores(want),
                                                abs=1e-6)
    bf16 = run_config(path, nvlabs_checkpoint, tmp_path / 'bf16',
                      dict(opts, **cpu))
    assert all(0 <= s <= 100 for s in stage_scores(bf16))
    log = ''.join(p.read_text() for p in (tmp_path / 'bf16').rglob('*.log'))
    assert 'bf16 autocast' in log and 'images/s' in log
    with open(tmp_path / 'bf16' / 'continual_results.json') as f:
        assert json.load(f)['stages']


@pytest.mark.parametrize('extra,message', [
    ({'test_cfg.cuda_graph': True}, 'cuda_graph=True needs the model on a '
     'CUDA device, it is on cpu'),
    ({'test_cfg.preset': 'bf16-graph'}, r"preset must be one of \('fast',\)"),
])
def test_the_loop_checks_its_speed_options_before_the_stream(
        extra, message, tiny_acdc, tmp_path):
    runner = tiny_runner(faithful(PRESETS[-1]), tiny_acdc, tmp_path, extra)
    with pytest.raises(ValueError, match=message):
        runner.test()
    assert not list(tmp_path.rglob('continual_results.json'))


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason='no CUDA device')
@pytest.mark.parametrize('path', PRESETS, ids=osp.basename)
def test_a_preset_on_cuda_equals_its_eager_run(path, nvlabs_checkpoint,
                                               tmp_path_factory, tmp_path):
    """Each shipped preset through ``tools/test.py``'s path on the tiny
    model, with its own loader (8 workers, pinned memory: the pin-memory
    thread allocates while a graph is captured), two stages (a graph
    captured again at the second): the stage scores of the same preset
    with its steps eager. Bfloat16 both; a replay runs the captured
    kernels, so only the reductions' order may differ. Six images a
    condition: two eager (``graph_warmup``), a capture, three replays."""
    root = str(make_acdc_like_tree(str(tmp_path_factory.mktemp('acdc6')),
                                   images_per_condition=6, size=(96, 48),
                                   seed=0))
    opts = tiny_options(root, rounds=1, head='nvlabs')
    del opts['test_dataloader.num_workers']  # the preset's own
    opts['test_dataloader.dataset.conditions'] = ('fog', 'night')
    cfg = Config.fromfile(path)
    assert cfg.test_dataloader.num_workers == 8
    assert cfg.test_dataloader.pin_memory is True
    got = run_config(path, nvlabs_checkpoint, tmp_path / 'preset', opts)
    eager = run_config(path, nvlabs_checkpoint, tmp_path / 'eager', dict(
        opts, **{'test_cfg.cuda_graph': False}))
    assert len(stage_scores(got)) == len(stage_scores(eager)) == 2
    assert stage_scores(got) == pytest.approx(stage_scores(eager), abs=0.05)
    log = ''.join(p.read_text() for p in (tmp_path / 'preset').rglob('*.log'))
    assert 'preset fast' in log

