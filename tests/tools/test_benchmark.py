"""tools/benchmark.py runs and counts passes (no timing is asserted); its
steps and arms (benchmarks.step_benchmark) and meters
(benchmarks.meters)."""
import argparse
import json
import os.path as osp
import sys

import pytest
import tool_runs
import torch

from benchmarks import meters, step_benchmark
from mmseg_stag.segmentation.methods.cotta import \
    view_probabilities as original_view_probabilities

REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))


def test_benchmark_counts_passes(tmp_path):
    out = tmp_path / 'bench.json'
    proc = tool_runs.run(
        [sys.executable, osp.join(REPO, 'tools/benchmark.py'), '--models',
         'b0', '--size', '64', '32', '--steps', '2', '--warmup', '0',
         '--out', str(out)], capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads(out.read_text())['models']['b0']
    passes = {arm: (r['forwards'], r['backwards'])
              for kind in res.values() for arm, r in kind.items()
              if isinstance(r, dict) and 'forwards' in r}
    assert passes == {
        'tent': (1, 1), 'tent+stag': (1, 1),
        'tent two-forward reference': (2, 1),
        'bn_adapt': (1, 0), 'bn_adapt+stag': (1, 1)}
    for kind in ('tent', 'bn_adapt'):
        assert res[kind]['stag_time_ratio']['median'] > 0
    assert 'stag_time_ratio' in proc.stdout
    # STAG's share is the paired whole steps' ratio: no term timed alone
    assert all('stag_term' not in res[kind] for kind in res)
    # STAG keeps its few per-pixel maps for the backward, never less
    tent = res['tent']
    assert tent['tent+stag']['saved_mb'] > tent['tent']['saved_mb']


def test_benchmark_classification_arms(tmp_path):
    out = tmp_path / 'bench.json'
    proc = tool_runs.run(
        [sys.executable, osp.join(REPO, 'tools/benchmark.py'), '--models',
         'resnet50', '--cls-size', '32', '--batch-size', '2', '--steps',
         '1', '--warmup', '0', '--out', str(out)],
        capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads(out.read_text())['models']['resnet50']
    assert set(res) == {'tent', 'eata'}  # BN Adapt is segmentation-only
    passes = {arm: (r['forwards'], r['backwards'])
              for kind in res.values() for arm, r in kind.items()
              if isinstance(r, dict) and 'forwards' in r}
    assert passes == {
        'tent': (1, 1), 'tent+stag': (1, 1),
        'tent two-forward reference': (2, 1),
        'eata': (1, 1), 'eata+stag': (1, 1)}


def test_segmentation_cotta_steps_on_the_teacher_views():
    """Segmentation CoTTA's arm steps as the ACDC config runs it: its
    teacher on the 14 views (7 ratios x 2 flips) of one image, the source
    model on the main view (ratio 1, unflipped), the student once; the
    other arms keep the single-view batch."""
    from benchmarks.meters import BackwardPasses, PassCounter
    args = argparse.Namespace(size=(128, 64), cls_size=32, batch_size=1)
    task = step_benchmark.BenchTask('b0', args, 'cpu', REPO)
    assert task.methods['cotta']['restore_prob'] == 0.01
    assert task.methods['cotta']['ap'] == 0.69
    batch = task.batch_for('cotta')
    assert len(batch.views) == 14 and batch.main_view == 4
    assert [tuple(v.inputs.shape[-2:]) for v in batch.views[::2]] == [
        (32, 64), (48, 96), (64, 128), (80, 160), (96, 192), (112, 224),
        (128, 256)]
    assert [m['flip'] for v in batch.views for m in v.metas] == \
        [False, True] * 7
    assert torch.equal(batch.inputs, task.batch.inputs)
    assert task.batch_for('tent') is task.batch
    method, student = task.make_method('cotta', None)
    teacher = PassCounter(task.counted(method.teacher))
    source = PassCounter(task.counted(method.source_model))
    with BackwardPasses() as backwards:
        task.ours_step(method, task.batch_for('cotta'))
    assert (student.forwards, backwards.count) == (1, 1)
    assert teacher.forwards == 14 and source.forwards == 1


def test_segmentation_cotta_batched_views_equal_one_at_a_time(monkeypatch):
    """``batch_views=True``: the 14 views in 7 teacher passes (a scale and
    its flip together), the same labels and statistics as one pass per
    view, and in float64 the same summed probabilities to 1e-12."""
    import dataclasses

    from benchmarks.meters import PassCounter
    from mmseg_stag.segmentation.methods import cotta
    args = argparse.Namespace(size=(128, 64), cls_size=32, batch_size=1)
    task = step_benchmark.BenchTask('b0', args, 'cpu', REPO)
    batch = task.batch_for('cotta')
    method, _ = task.make_method('cotta', None, batch_views=True)
    assert method.batch_views
    teacher, source = method.teacher.double(), method.source_model.double()
    views = [dataclasses.replace(v, inputs=v.inputs.double())
             for v in batch.views]
    assert cotta.view_groups(views, True) == [[2 * i, 2 * i + 1]
                                              for i in range(7)]
    probabilities = []  # every teacher pass's, in order
    monkeypatch.setattr(cotta, 'view_probabilities', lambda *a: (
        probabilities.append(original_view_probabilities(*a))
        or probabilities[-1]))
    results, sums = {}, {}
    for batched in (True, False):
        counter = PassCounter(task.counted(teacher))
        probabilities.clear()
        results[batched] = cotta.teacher_labels(
            task.task_adapter, teacher, source, views, batch.main_view,
            method.ap, batched)
        assert counter.forwards == (7 if batched else 14)
        # the teacher's passes, then the source model's main view
        sums[batched] = sum(p.sum(0) for p in probabilities[:-1])
    (got, got_stats), (ref, ref_stats) = results[True], results[False]
    assert torch.equal(got, ref)
    assert {k: float(v) for k, v in got_stats.items()} == \
        {k: float(v) for k, v in ref_stats.items()}
    torch.testing.assert_close(sums[True], sums[False], rtol=1e-12,
                               atol=1e-12)


def test_ecotta_memory_against_tent_and_cotta(monkeypatch, capsys):
    """The CIFAR arms on a thin WRN-28-1 (EcoTTA's K=4 preset of 12
    blocks): two passes each way for EcoTTA, the activations of every
    method compared to EcoTTA's."""
    monkeypatch.setitem(step_benchmark.CIFAR_MODELS, 'wrn-28-10', dict(
        type='WideResNet', depth=28, widen_factor=1, num_classes=10))
    args = argparse.Namespace(
        methods=['tent', 'cotta', 'ecotta'], batch_size=4, steps=1,
        warmup=0, mixed_precision=None, skip_reference=True, cls_size=32)
    monkeypatch.setitem(step_benchmark.BASELINES['cifar'], 'cotta', dict(
        type='cotta', num_augs=1))
    res = step_benchmark.run_model('wrn-28-10', args, 'cpu')
    passes = {arm: (r['forwards'], r['backwards'])
              for kind in ('tent', 'cotta', 'ecotta')
              for arm, r in res[kind].items() if 'forwards' in r}
    assert passes['ecotta'] == passes['ecotta+stag'] == (2, 2)
    assert passes['tent'] == passes['tent+stag'] == (1, 1)
    assert set(res['activations_mb']) == {'tent', 'cotta', 'ecotta'}
    assert all(v > 0 for v in res['activations_mb'].values())
    assert 'activations kept for backward' in capsys.readouterr().out


def test_saved_for_backward_keeps_the_largest_graph():
    """Two updates in one step (EcoTTA): the first graph is freed at its
    backward, so the block's figure is the larger graph, not the sum."""
    x = torch.ones(1000, requires_grad=True)
    with meters.SavedForBackward() as saved:
        (x * x).sum().backward()        # saves x: 4,000 bytes
        (x.exp() * x.sin()).sum().backward()  # exp, sin, x: 12,000 bytes
    assert saved.mb * 2**20 == 12000
    assert saved.count == 2  # the backward passes


def test_backward_passes_through_the_saved_tensor_hooks():
    """Counted without replacing any torch function: one per backward
    pass of a graph built in the block (SAR's two, EcoTTA's two), none
    for a forward without gradients."""
    assert torch.autograd.backward.__module__ == 'torch.autograd'
    x = torch.ones(10, requires_grad=True)
    with meters.BackwardPasses() as bp:
        with torch.no_grad():
            (x * x).sum()
        assert bp.count == 0
        for _ in range(2):
            (x * x).sum().backward()
    assert bp.count == 2


def test_peak_memory_folds_before_a_reset(monkeypatch):
    """The GPU path's bookkeeping on a stand-in device whose peak is
    global: a nested block's start and :func:`fold_peak_memory` (before a
    log processor's reset) keep the outer block's peak; nothing of torch
    is replaced by the meter."""
    device = dict(allocated=100, peak=100)

    def reset():
        device['peak'] = device['allocated']

    cuda = dict(is_available=lambda: True, synchronize=lambda: None,
                reset_peak_memory_stats=reset,
                memory_allocated=lambda: device['allocated'],
                max_memory_allocated=lambda: device['peak'],
                max_memory_reserved=lambda: device['peak'])
    for name, fn in cuda.items():
        monkeypatch.setattr(torch.cuda, name, fn)
    with meters.PeakMemory() as outer:
        device['peak'] = 900  # a step's peak
        meters.fold_peak_memory()
        reset()  # MMEngine's log processor, after the fold
        with meters.PeakMemory() as inner:
            assert meters.PeakMemory.active == [outer, inner]
            device['peak'] = 300
        assert torch.cuda.reset_peak_memory_stats is reset
    assert outer.peak == 900 and inner.peak == 300
    assert meters.PeakMemory.active == []


def test_saved_for_backward_counts_distinct_storages():
    x = torch.ones(1000, requires_grad=True)
    w = torch.full((1000, ), 2.0)
    with meters.SavedForBackward() as saved:
        y = x * w           # saves x and w: 2 x 4,000 bytes
        z = (y * x).sum()   # saves y, and x again (counted once)
    assert saved.mb * 2**20 == 3 * 4000
    z.backward()
    assert torch.equal(x.grad, 2 * 2 * x.detach())


def test_benchmark_under_bf16_autocast(tmp_path):
    out = tmp_path / 'bench.json'
    proc = tool_runs.run(
        [sys.executable, osp.join(REPO, 'tools/benchmark.py'), '--models',
         'b0', '--methods', 'tent', '--size', '64', '32', '--steps', '1',
         '--warmup', '0', '--skip-reference', '--mixed-precision', 'bf16',
         '--out', str(out)], capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads(out.read_text())
    assert data['mixed_precision'] == 'bf16'
    tent = data['models']['b0']['tent']
    assert (tent['tent+stag']['forwards'], tent['tent+stag']['backwards']) \
        == (1, 1)


def test_step_timer_on_the_cpu():
    with meters.StepTimer(cuda=False) as timer:
        torch.ones(100).sum()
    assert timer.seconds > 0


@pytest.mark.cuda
def test_peak_memory_across_resets_on_cuda():
    """On a GPU, a ``reset_peak_memory_stats`` inside the block (MMEngine's
    log processor makes one per log interval) after a fold does not lose
    the earlier peak, and a nested block folds into the outer one."""
    from mmengine.device import get_max_cuda_memory
    with meters.PeakMemory() as outer:
        big = torch.empty(256 * 2**20, dtype=torch.uint8, device='cuda')
        del big
        meters.fold_peak_memory()  # as efficiency.py's hook, before
        get_max_cuda_memory()  # the log line: reads, then resets
        with meters.PeakMemory() as inner:
            small = torch.empty(16 * 2**20, dtype=torch.uint8,
                                device='cuda')
            del small
    assert outer.delta_mb >= 256
    assert 16 <= inner.delta_mb < 256
    assert outer.peak_reserved >= outer.peak


@pytest.mark.cuda
def test_benchmark_on_cuda(tmp_path):
    """The same tool on a GPU: CUDA events, max_memory_allocated, the same
    pass counts."""
    with meters.StepTimer() as timer:
        torch.ones(1000, device='cuda').sum()
    assert timer.cuda and timer.seconds > 0
    out = tmp_path / 'bench.json'
    proc = tool_runs.run(
        [sys.executable, osp.join(REPO, 'tools/benchmark.py'), '--models',
         'b0', '--methods', 'tent', '--size', '128', '64', '--steps', '2',
         '--warmup', '1', '--out', str(out)], capture_output=True,
        text=True, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads(out.read_text())
    assert 'cuda' in json.dumps(data['machine']).lower()
    tent = data['models']['b0']['tent']
    assert (tent['tent+stag']['forwards'], tent['tent+stag']['backwards']) \
        == (1, 1)
    assert tent['tent+stag']['peak_mb'] > 0


def test_benchmark_hybrid_tta_beside_tent_and_cotta(tmp_path):
    """Hybrid-TTA's step (teacher, masked student, one backward) and its
    +STAG arm beside TENT's and CoTTA's when named (a segmentor's default
    skips both); its mask patches need a size multiple of 32."""
    out = tmp_path / 'bench.json'
    cmd = [sys.executable, osp.join(REPO, 'tools/benchmark.py'), '--models',
           'b0', '--methods', 'tent', 'cotta', 'hybrid_tta', '--steps', '1',
           '--warmup', '0', '--skip-reference', '--out', str(out)]
    proc = tool_runs.run(cmd + ['--size', '128', '64'], capture_output=True,
                          text=True, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads(out.read_text())['models']['b0']
    assert set(res) == {'tent', 'cotta', 'hybrid_tta'}
    # the student's classifier runs once (the teachers and CoTTA's source
    # model are other modules: the views test above counts them)
    for kind in ('cotta', 'hybrid_tta'):
        for arm in (kind, kind + '+stag'):
            assert (res[kind][arm]['forwards'],
                    res[kind][arm]['backwards']) == (1, 1)
            assert res[kind][arm]['peak_mb'] > 0
        assert res[kind]['stag_time_ratio']['median'] > 0
    proc = tool_runs.run(cmd + ['--size', '960', '540'],
                          capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 2
    assert 'multiples of 32' in proc.stderr


def test_benchmark_refuses_a_size_too_small_for_cottas_views(tmp_path):
    proc = tool_runs.run(
        [sys.executable, osp.join(REPO, 'tools/benchmark.py'), '--models',
         'b0', '--methods', 'cotta', '--size', '64', '32', '--out',
         str(tmp_path / 'b.json')], capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 2
    assert 'smallest teacher view' in proc.stderr and '32x16' in proc.stderr
    assert not (tmp_path / 'b.json').exists()


def test_segmentation_arms_are_the_shipped_configs_methods():
    """The SegFormer arms run the shipped configs' ``test_cfg.method``
    (TENT's cross-entropy at the original size) on a batch whose metainfo
    says ACDC's 1080x1920 with the input at ``--size``; the graphed arms
    are the methods of the ``_bf16-graph`` presets."""
    from mmengine.config import Config
    args = argparse.Namespace(size=(128, 64), cls_size=32, batch_size=1)
    task = step_benchmark.BenchTask('b0', args, 'cpu', REPO)
    assert task.methods['tent']['loss'] == 'pseudo_ce_fullres'
    assert task.methods['tent_graph'] == task.methods['tent']
    assert task.config_of('tent') == step_benchmark.SEG_CONFIG.format('tent')
    meta = task.raw['data_samples'][0].metainfo
    assert meta['ori_shape'] == (1080, 1920)
    assert meta['img_shape'] == (64, 128)
    assert task.batch.inputs.shape[-2:] == (64, 128)
    for kind, name in (('tent_graph', 'tent'), ('cotta_graph', 'cotta')):
        preset = osp.join(REPO, step_benchmark.SEG_CONFIG.format(
            name + '_bf16-graph'))
        if osp.isfile(preset):  # the presets' test_cfg.method
            cfg = Config.fromfile(preset)
            assert cfg.test_cfg.cuda_graph is True
            assert cfg.test_cfg.method.to_dict() == task.methods[kind]
