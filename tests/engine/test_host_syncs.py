"""A TENT+STAG step waits for the device zero times between log intervals:
its statistics stay 0-d tensors until the loop reads them all at once, at
the logger's interval or a stage end (see tests/host_syncs.py for what is
counted); BN Adapt and CoTTA likewise, Hybrid-TTA once a step (its tuning
switch). Classification's step likewise."""
import pytest
from host_syncs import count_loop_syncs
from seg_helpers import make_runner


def syncs_per_batch(runner, monkeypatch, stats_reads=None):
    per_batch = count_loop_syncs(runner.test_loop, monkeypatch,
                                 stats_reads=stats_reads)
    runner.test()
    return per_batch, runner.test_loop.schedule


#: CoTTA's teacher views at the tiny size; Hybrid-TTA's modules at it
COTTA = {'test_dataloader.dataset.pipeline.1.scale': (128, 64),
         'test_dataloader.dataset.pipeline.1.ratios': [0.5, 1.0, 1.5]}
HYBRID = {'test_cfg.method.mask_patch_size': 8,
          'test_cfg.method.neck_embed_dim': 16}
#: Hybrid-TTA's tuning switch reads its window's loss every step (the
#: authors' FreezeController decides on the host)
SWITCH_READ = ['item', '_local_scalar_dense']


@pytest.mark.parametrize('method,extra,step_reads', [
    ('tent-stag', {}, []), ('bn-adapt-stag', {}, []),
    ('cotta-stag', COTTA, []), ('hybrid-tta-stag', HYBRID, SWITCH_READ)])
def test_segmentation_step_never_waits_between_reads(
        method, extra, step_reads, tiny_acdc, tiny_checkpoint, tmp_path,
        monkeypatch):
    runner = make_runner(method, tiny_acdc, tiny_checkpoint, tmp_path,
                         extra={'default_hooks.logger.interval': 50,
                                **extra})
    stats_reads = []
    per_batch, stages = syncs_per_batch(runner, monkeypatch, stats_reads)
    assert len(per_batch) == len(stages) == 8
    for idx, calls in per_batch.items():
        assert calls == step_reads, (idx, calls)
    # the statistics are read after each stage's last batch, once
    assert stats_reads == [['tolist']] * sum(s.ends for s in stages)
    # and the log still has every batch's values
    scalars = runner.message_hub.log_scalars
    assert len(scalars['test/loss_stag'].data[0]) == 8



def test_optimizer_reads_host_tensors_only_unless_fused(
        tiny_acdc, tiny_checkpoint, tmp_path, monkeypatch):
    """TENT+STAG's Adam reads the step count of each adapted tensor (a CPU
    tensor on a GPU too, unless fused: no wait for the device, but one
    host call each); with ``optimizer.fused=True`` it reads nothing, and
    the run's numbers are the same."""
    metrics = {}
    for fused in (False, True):
        extra = {'default_hooks.logger.interval': 50}
        if fused:
            extra['test_cfg.method.optimizer.fused'] = True
        runner = make_runner('tent-stag', tiny_acdc, tiny_checkpoint,
                             tmp_path / str(fused), extra=extra)
        host = {}
        with monkeypatch.context() as patch:
            per_batch = count_loop_syncs(runner.test_loop, patch, host)
            metrics[fused] = runner.test()
        method = runner.test_loop.method
        assert method.optimizer.defaults['fused'] is (fused or None)
        reads = [] if fused else ['item', '_local_scalar_dense'] * len(
            method.params)
        for idx, calls in per_batch.items():
            assert calls in ([], ['tolist']), (idx, calls)  # as above
            assert host[idx] == reads, (idx, host[idx])
    assert metrics[True] == metrics[False]


@pytest.fixture(scope='module')
def acdc_4_a_stage(tmp_path_factory):
    from demo_data import make_acdc_like_tree
    return str(make_acdc_like_tree(str(tmp_path_factory.mktemp('acdc4')),
                                   images_per_condition=4, size=(96, 48),
                                   seed=0))


@pytest.mark.parametrize('method,graph', [
    ('tent-stag', False), ('tent-stag', True), ('bn-adapt-stag', False),
    ('cotta-stag', False)])
def test_the_loop_reads_the_device_only_at_stage_ends(
        method, graph, acdc_4_a_stage, tiny_checkpoint, tmp_path,
        monkeypatch):
    """The whole loop iteration, nothing paused: the batch to the device,
    the step, the task's outputs, the metric's areas (kept on the device),
    and the stage restart (the optimizer zeroed in place): no read of the
    device from a stage's first batch to its last. A stage's end reads
    the statistics once and the metric's areas once. TENT+STAG eager and
    with the step replayed as a (stand-in) CUDA graph, which the stage
    restart keeps; BN Adapt+STAG and segmentation CoTTA+STAG eager."""
    from host_syncs import count_whole_loop

    from benchmarks import stand_in_graph
    extra = {'default_hooks.logger.interval': 50,
             **(COTTA if method.startswith('cotta') else {})}
    if graph:
        stand_in_graph.install(monkeypatch, loop=True)
        extra['test_cfg.cuda_graph'] = True
    runner = make_runner(method, acdc_4_a_stage, tiny_checkpoint,
                         tmp_path, extra=extra)
    loop = runner.test_loop
    per_batch, stage_ends = count_whole_loop(loop, monkeypatch)
    runner.test()
    assert 'optimizer' in loop.method.stage_restart
    assert len(per_batch) == 16 and len(stage_ends) == 4
    for idx, calls in per_batch.items():
        assert calls == [], (idx, calls)
    # the statistics in one transfer, the stage's areas in one (to NumPy)
    for calls in stage_ends:
        assert sorted(calls) == ['cpu', 'numpy', 'tolist'], calls
    if graph:
        (captured, ) = loop.graph_step.captures
        assert captured.replays == 14  # one capture kept by every stage
