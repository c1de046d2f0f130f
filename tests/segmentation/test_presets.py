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
from run_helpers import run_config
from seg_helpers import REPO, build_from_config, save_checkpoint, tiny_options

from demo_data import make_acdc_like_tree

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


#: CoTTA's teacher views at the tiny size: the 0.5 view of a 64 x 32 input
#: is below the MiT's patch kernels, of 128 x 64 it is not
COTTA_VIEWS = {'test_dataloader.dataset.pipeline.1.scale': (128, 64),
               'test_dataloader.dataset.pipeline.1.ratios': [0.5, 1.0, 1.5]}


def preset_options(path: str, root: str, rounds: int = 2) -> dict:
    """The tiny model and stream in place of a preset's (or its faithful
    config's): CoTTA's views at a size the MiT takes."""
    opts = tiny_options(root, rounds=rounds, head='nvlabs')
    if method_of(path).startswith('cotta'):
        opts.update(COTTA_VIEWS)
    return opts


@pytest.mark.parametrize('method', ['source', 'bn-adapt-stag', 'tent-stag',
                                    'cotta-stag'])
def test_the_cpu_parts_of_a_preset_run_through_tools_test(
        method, tiny_acdc, nvlabs_checkpoint, tmp_path):
    """The preset without its CUDA parts (``preset``, ``cuda_graph``): SDPA
    and views give the faithful run's stage scores (float32: equal to
    rounding; CoTTA with the preset's method options both); bfloat16
    autocast runs to the end, finite."""
    path = next(p for p in PRESETS if method_of(p) == method)
    cpu = {'test_cfg.preset': None, 'test_cfg.cuda_graph': False}
    opts = preset_options(path, tiny_acdc)
    # CoTTA's preset draws its restore on the device: the faithful run too
    method_options = {k: v for k, v in flat(Config.fromfile(path).to_dict())
                      .items() if k in ('test_cfg.method.restore_on_device',
                                        'test_cfg.method.batch_views')}
    want = run_config(faithful(path), nvlabs_checkpoint, tmp_path / 'plain',
                      dict(opts, **method_options))
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


#: a learning rate at which a replay that updates nothing, or updates on
#: the captured batch instead of the new one, moves the scores and the
#: weights (the configs' 7.5e-6 barely moves the tiny model in a stage)
GRAPH_TEST_LR = 1e-3


def graph_run(path, checkpoint, work_dir, opts):
    """A preset through ``tools/test.py``'s path, in this process (its
    runner kept): the stage scores, the adapted weights and, for a graph
    preset, its ``CUDAGraphStep`` with each capture's key and how many
    replays stepped on a batch other than the one captured."""
    from mmseg_stag.core.methods.step_graph import CUDAGraphStep
    from mmseg_stag.engine.runs import prepare_config, run_test
    cfg = Config.fromfile(path)
    cfg.merge_from_dict(opts)
    cfg = prepare_config(cfg, str(work_dir), path)
    captures, replays_on_new = [], []
    capture, call = CUDAGraphStep.capture, CUDAGraphStep.__call__

    def counted_capture(self, batch, beta):
        captures.append(batch.inputs.clone())
        return capture(self, batch, beta)

    def counted_call(self, batch, beta):
        out = call(self, batch, beta)
        if self.graphs and captures and not torch.equal(batch.inputs,
                                                        captures[-1]):
            replays_on_new.append(1)
        return out

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(CUDAGraphStep, 'capture', counted_capture)
        patch.setattr(CUDAGraphStep, '__call__', counted_call)
        _, model = run_test(cfg, checkpoint)
    with open(osp.join(str(work_dir), 'continual_results.json')) as f:
        results = json.load(f)
    weights = {k: v.detach().float().cpu() for k, v in
               model.state_dict().items()}
    return results, weights, len(captures), len(replays_on_new)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason='no CUDA device')
@pytest.mark.parametrize('path', PRESETS, ids=osp.basename)
def test_a_preset_on_cuda_equals_its_eager_run(path, nvlabs_checkpoint,
                                               tmp_path_factory, tmp_path):
    """Each shipped preset through ``tools/test.py``'s path on the tiny
    model, with its own loader (8 workers, pinned memory: more images than
    the loader holds ahead, so batches are still pinned while a graph is
    captured and replayed), two stages (the optimizer restarted in place:
    the graph kept), at a learning rate where an update shows: the stage
    scores and the adapted weights of the same preset with its steps
    eager. A graph preset must have captured and replayed on new batches.
    Bfloat16 both; a replay runs the captured kernels, so only the
    reductions' order may differ: 0.5 mIoU points and 5 % of the weights'
    change."""
    root = str(make_acdc_like_tree(str(tmp_path_factory.mktemp('acdc24')),
                                   images_per_condition=24, size=(96, 48),
                                   seed=0))
    opts = preset_options(path, root, rounds=1)
    del opts['test_dataloader.num_workers']  # the preset's own
    opts['test_dataloader.dataset.conditions'] = ('fog', 'night')
    if method_of(path) not in ('source', 'bn-adapt'):
        opts['test_cfg.method.optimizer.lr'] = GRAPH_TEST_LR
    cfg = Config.fromfile(path)
    assert cfg.test_dataloader.num_workers == 8
    assert cfg.test_dataloader.pin_memory is True
    got, weights, captures, on_new = graph_run(
        path, nvlabs_checkpoint, tmp_path / 'preset', opts)
    eager, eager_weights, eager_captures, _ = graph_run(
        path, nvlabs_checkpoint, tmp_path / 'eager',
        dict(opts, **{'test_cfg.cuda_graph': False}))
    assert eager_captures == 0
    if method_of(path) in GRAPHED:
        # one input size: one capture survives both stages; 24 + 24
        # images, 2 eager warm-up steps and the capture's own batch
        assert captures == 1 and on_new == 45, (captures, on_new)
    else:
        assert captures == 0
    assert len(stage_scores(got)) == len(stage_scores(eager)) == 2
    assert stage_scores(got) == pytest.approx(stage_scores(eager), abs=0.5)
    source = torch.load(nvlabs_checkpoint, map_location='cpu')['state_dict']
    change = sum(float((eager_weights[k] - source[k].float()).norm())
                 for k in source if k in eager_weights)
    apart = sum(float((weights[k] - eager_weights[k]).norm())
                for k in source if k in weights)
    if method_of(path) in GRAPHED:
        assert change > 0 and apart <= 0.05 * change, (apart, change)
    log = ''.join(p.read_text() for p in (tmp_path / 'preset').rglob('*.log'))
    assert 'preset fast' in log
