"""``cuda_graph=True``: the whole step replayed as a CUDA graph
(``CUDAGraphStep``, around the method). On the CPU: what is refused, and the
bookkeeping around the graph (warm-up per input shape, ``beta_t`` fed each
replay, outputs copied, graphs dropped with the optimizer) through a stand-in
graph that replays the step's Python on the captured inputs. On CUDA: real
graphs against the eager step."""
import copy
import os.path as osp
from contextlib import contextmanager

import pytest
import torch
from host_syncs import HostSyncCounter
from test_base_method import ADAPTER, configured, images, make_model

from benchmarks.stand_in_graph import (StandInStream, same_stream,
                                       stand_in_capture)
from mmseg_stag.core import TENT, Batch, BNAdapt, build_method
from mmseg_stag.core.methods.step_graph import (CUDAGraphStep,
                                                check_capturable_optimizer,
                                                graph_key)

STAG = dict(beta0=5.0, gamma=3.0)


def test_methods_that_read_back_refuse_it():
    for kind in ('eata', 'sar', 'deyo', 'cotta', 'ecotta'):
        with pytest.raises(ValueError, match='cuda_graph=True is for'):
            CUDAGraphStep(build_method(dict(type=kind)))
    assert TENT.graph_capturable and BNAdapt.graph_capturable


def test_optimizers():
    tent = TENT()  # the default Adam
    assert 'capturable' not in tent.optimizer_cfg  # eager: as configured
    CUDAGraphStep(tent)
    assert tent.optimizer_cfg['capturable'] is True
    assert check_capturable_optimizer(dict(type='AdamW', lr=1))[
        'capturable'] is True
    sgd = dict(type='SGD', lr=0.1, momentum=0.9)
    assert check_capturable_optimizer(sgd) == sgd
    with pytest.raises(ValueError, match="got 'RMSprop'"):
        CUDAGraphStep(TENT(optimizer=dict(type='RMSprop', lr=1)))
    with pytest.raises(ValueError, match='capturable=False'):
        CUDAGraphStep(TENT(optimizer=dict(type='Adam', lr=1,
                                          capturable=False)))


def test_a_model_off_the_gpu_and_a_late_wrapper_are_refused():
    method = TENT(optimizer=dict(type='SGD', lr=0.1))
    step = CUDAGraphStep(method)
    configured(method, make_model())
    with pytest.raises(ValueError, match=r"CUDA device.*\['cpu'\]"):
        method.adapt(Batch(images()), replay=step)
    # after configure Adam is built: too late to make it capturable
    with pytest.raises(ValueError, match='before configure'):
        CUDAGraphStep(configured(TENT(), make_model()))
    with pytest.raises(ValueError, match='warmup must be >= 1'):
        CUDAGraphStep(TENT(), warmup=0)
    batch = type('B', (), {'inputs': [torch.zeros(1)]})()
    with pytest.raises(ValueError, match='one tensor, got list'):
        graph_key(batch)


def test_an_option_that_reads_the_device_is_refused_by_name():
    """``stag.check_finite=True`` waits on the device inside the step: a
    capture cannot, so the wrapper refuses it before any step."""
    for kind in ('tent', 'bn_adapt'):
        method = build_method(dict(type=kind, stag=dict(STAG,
                                                        check_finite=True)))
        with pytest.raises(ValueError, match=r'stag.check_finite=True reads '
                           r'the device.*cuda_graph=False'):
            CUDAGraphStep(method)
    CUDAGraphStep(build_method(dict(type='tent', stag=dict(
        STAG, check_finite=False))))  # the default: accepted


def seg_batch(**meta):
    from mmseg.structures import SegDataSample

    from mmseg_stag.segmentation.task_adapter import SegmentationBatch
    metas = [dict(dict(img_shape=(4, 6), ori_shape=(8, 12), pad_shape=(4, 6),
                       padding_size=[0, 0, 0, 0]), **meta)]
    return SegmentationBatch(torch.zeros(1, 3, 4, 6), [SegDataSample(
        metainfo=m) for m in metas], metas)


def test_the_key_holds_what_the_post_processing_reads():
    """MMSeg's ``postprocess_result`` crops by ``img_padding_size`` before
    ``padding_size``, flips and resizes to ``ori_shape``: each its own
    graph, from the batch's metas or only its data samples' metainfo."""
    plain = graph_key(seg_batch())
    for meta in (dict(img_padding_size=[0, 2, 0, 1]),
                 dict(padding_size=[0, 2, 0, 1]), dict(ori_shape=(8, 13)),
                 dict(flip=True, flip_direction='horizontal')):
        assert graph_key(seg_batch(**meta)) != plain, meta
    assert graph_key(seg_batch()) == plain
    batch = seg_batch()
    batch.data_samples[0].set_metainfo(dict(img_padding_size=[1, 0, 0, 0]))
    assert graph_key(batch) != plain


class StandInCUDAGraph:
    """What a capture is given, recorded; the step runs eagerly inside."""
    made = []

    def __init__(self):
        self.made.append(self)

    def replay(self):
        pass


@contextmanager
def recorded_capture(graph, **kwargs):
    graph.kwargs = kwargs
    yield


def test_each_capture_tolerates_other_threads_in_its_own_pool(
        stand_in_cuda, monkeypatch):
    """``capture_error_mode='thread_local'``: the loader's pin-memory thread
    allocates pinned host memory while the main thread captures (the
    default 'global' mode fails the capture, pytorch#146924); no pool
    argument: each graph its own pool, freed with the graph (a reset)."""
    monkeypatch.setattr(torch.cuda, 'CUDAGraph', StandInCUDAGraph)
    monkeypatch.setattr(torch.cuda, 'graph', recorded_capture)
    StandInCUDAGraph.made = []
    method = TENT(stag=STAG, optimizer=dict(type='SGD', lr=0.1))
    graphs = CUDAGraphStep(method, warmup=1)
    configured(method, make_model())
    graphs.check_method = lambda: None
    for x in stream_of_batches():
        method.adapt(Batch(x), replay=graphs)
    graphs.clear()
    method.adapt(Batch(images(0)), replay=graphs)
    method.adapt(Batch(images(1)), replay=graphs)
    assert len(StandInCUDAGraph.made) == 3  # two keys, then after a reset
    for graph in StandInCUDAGraph.made:
        assert graph.kwargs['capture_error_mode'] == 'thread_local'
        assert graph.kwargs.get('pool') is None
    assert not hasattr(graphs, 'pool')


def test_a_replayed_step_post_processes_once(stand_in_cuda, monkeypatch):
    """TENT with the shipped config's full-size loss post-processes its
    logits in the step (its labels at the original size): a replay hands
    copies of the graph's post-processed labels (not its full-size
    logits) to the batch's own data samples, so the task does not
    post-process again; they equal the eager step's, and the batch the
    graph was captured on keeps its own samples."""
    import argparse

    from benchmarks import step_benchmark
    from mmseg_stag.segmentation.task_adapter import SegmentationAdapter
    repo = osp.dirname(osp.dirname(osp.dirname(osp.dirname(
        osp.abspath(__file__)))))
    args = argparse.Namespace(size=(128, 64), cls_size=32, batch_size=1,
                              ori_size=(160, 80))
    task = step_benchmark.BenchTask('b0', args, 'cpu', repo)
    opt = dict(optimizer=dict(type='SGD', lr=0.1))
    eager, _ = task.make_method('tent', STAG, **opt)
    method, _ = task.make_method('tent', STAG, **opt)
    assert method.loss_type == 'pseudo_ce_fullres'
    graphs = graphed(method, None)
    calls = []
    postprocess = SegmentationAdapter.postprocess
    monkeypatch.setattr(SegmentationAdapter, 'postprocess', lambda *a: (
        calls.append(1), postprocess(*a))[1])
    gen = torch.Generator().manual_seed(0)
    batches = []
    for i in range(5):
        raw = step_benchmark.random_batch('seg', args)
        raw['inputs'] = [torch.randint(0, 256, (3, 64, 128), dtype=torch.uint8,
                                       generator=gen)]
        batches.append((task.online.batch(method.model, raw),
                        task.online.batch(eager.model, copy.deepcopy(raw))))
    for i, (batch, twin) in enumerate(batches):
        want, _ = eager.adapt(twin)
        del calls[:]
        got, _ = method.adapt(batch, replay=graphs)
        replayed = i >= 2  # two eager steps, then a capture and replays
        # the step post-processes once (a capture's Python once more),
        # the task none
        assert len(calls) == (2 if i == 2 else 1), (i, len(calls))
        outputs = task.online.outputs(batch, got)
        assert len(calls) == (2 if i == 2 else 1), (i, len(calls))
        assert outputs is batch.data_samples
        wanted = task.online.outputs(twin, want)
        for o, w in zip(outputs, wanted):
            # a replay copies the labels out, not the full-size logits
            # (REPLAY_FIELDS: nothing downstream reads them)
            assert ('seg_logits' in o) != replayed
            keys = ('pred_sem_seg', ) if replayed else ('seg_logits',
                                                        'pred_sem_seg')
            for key in keys:
                assert torch.equal(o.get(key).data, w.get(key).data), key
        if replayed:
            (captured, ) = graphs.graphs.values()
            assert outputs[0].pred_sem_seg.data is not captured.post[0][
                'pred_sem_seg']
    # the first replayed batch's samples were not the capture's
    assert batches[2][0].data_samples[0].pred_sem_seg.data is not \
        graphs.captures[0].outputs[2][0]['pred_sem_seg']


@pytest.fixture
def stand_in_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, 'current_stream', StandInStream)
    monkeypatch.setattr(torch.cuda, 'Stream', StandInStream)
    monkeypatch.setattr(torch.cuda, 'stream', same_stream)


def graphed(method, model, adapter=ADAPTER):
    """``method``'s :class:`CUDAGraphStep` with the stand-in capture, the
    method configured on the CPU (the step's device check skipped)."""
    graphs = CUDAGraphStep(method, warmup=2)
    if model is not None:
        configured(method, model)
    graphs.check_method = lambda: None
    graphs.captures = []
    graphs.capture = stand_in_capture.__get__(graphs)
    return graphs


def stream_of_batches():
    """Seven batches: a shape, a second shape, the first again."""
    small = [images(seed) for seed in range(4)]
    large = [torch.randn(2, 3, 8, 5,
                         generator=torch.Generator().manual_seed(9 + i))
             for i in range(3)]
    return small[:3] + large + small[3:]


@pytest.mark.parametrize('kind,stag', [('tent', STAG), ('bn_adapt', STAG),
                                       ('bn_adapt', None)])
def test_stand_in_graph_steps_each_batch_once_as_eager(kind, stag,
                                                       stand_in_cuda):
    """BN Adapt without STAG steps without an optimizer (no update): its
    graph replays the statistics pass alone."""
    cls = TENT if kind == 'tent' else BNAdapt
    opt = {} if stag is None else dict(
        optimizer=dict(type='SGD', lr=0.1, momentum=0.9))
    eager = configured(cls(stag=stag, **opt), make_model())
    method = cls(stag=stag, **opt)
    graphs = graphed(method, make_model())
    assert (method.optimizer is None) == (stag is None)
    for i, x in enumerate(stream_of_batches()):
        method.start_stage(i // 4)  # stage_restart: nothing (default)
        eager.start_stage(i // 4)
        want, want_stats = eager.adapt(Batch(x))
        got, got_stats = method.adapt(Batch(x), replay=graphs)
        torch.testing.assert_close(got.value, want.value, rtol=0, atol=0)
        assert set(got_stats) == set(want_stats)
        for key, value in want_stats.items():
            assert float(got_stats[key]) == pytest.approx(float(value),
                                                          rel=1e-6), key
    # 2 eager batches of each shape, then one capture each; the captured
    # outputs copied, not handed out
    assert len(graphs.captures) == 2
    assert [g.replays for g in graphs.captures] == [2, 1]
    assert got.value is not graphs.captures[0].outputs[0].value
    updates = 0 if stag is None else 7
    assert method.t == eager.t == updates
    assert method.num_updates == updates
    for (name, p), (_, q) in zip(method.model.named_parameters(),
                                 eager.model.named_parameters()):
        torch.testing.assert_close(p, q, rtol=0, atol=0, msg=name)
    for (name, b), (_, c) in zip(method.model.named_buffers(),
                                 eager.model.named_buffers()):
        torch.testing.assert_close(b, c, rtol=0, atol=0, msg=name)


def test_a_stage_restart_keeps_the_graph_a_new_optimizer_or_state_drops_it(
        stand_in_cuda):
    """``stage_restart=('optimizer',)`` zeroes the optimizer's state in
    place (the same updates as a new optimizer's): the graph that steps
    those tensors survives the stage. An optimizer whose new state is not
    zeros (SGD with dampening) is rebuilt, and a loaded state replaces the
    tensors: both drop the graphs."""
    sgd = dict(type='SGD', lr=0.1, momentum=0.9)
    method = TENT(stag=STAG, optimizer=sgd, stage_restart=('optimizer', ))
    graphs = graphed(method, make_model())
    eager = configured(TENT(stag=STAG, optimizer=sgd), make_model())
    for stage, seeds in enumerate((range(4), range(4, 9))):
        method.start_stage(stage)
        if stage:  # the eager twin restarts with a new optimizer
            eager.optimizer = eager.build_optimizer()
        for seed in seeds:
            method.adapt(Batch(images(seed)), replay=graphs)
            eager.adapt(Batch(images(seed)))
            if stage == 0 and seed == 3:
                method.start_stage(0)  # the same stage: nothing restarts
    # 9 batches: 2 eager, then a capture (and its replay) and 6 replays
    assert len(graphs.captures) == 1 and graphs.captures[0].replays == 7
    for p, q in zip(method.model.parameters(), eager.model.parameters()):
        torch.testing.assert_close(p, q, rtol=0, atol=0)
    optimizer = method.optimizer
    # a loaded state replaces the optimizer's state tensors (momentum)
    method.load_state_dict(method.state_dict())
    method.adapt(Batch(images(9)), replay=graphs)
    assert method.optimizer is optimizer
    assert graphs.graphs == {} and list(graphs.eager_steps.values()) == [1]
    damped = TENT(stag=STAG, optimizer=dict(sgd, dampening=0.5),
                  stage_restart=('optimizer', ))
    graphs = graphed(damped, make_model())
    damped.start_stage(0)
    for seed in range(3):
        damped.adapt(Batch(images(seed)), replay=graphs)
    assert len(graphs.graphs) == 1
    first = damped.optimizer
    damped.start_stage(1)  # a new optimizer: the graph stepped the old one
    damped.adapt(Batch(images(5)), replay=graphs)
    assert damped.optimizer is not first
    assert graphs.graphs == {} and list(graphs.eager_steps.values()) == [1]


# ------------------------------------------------------------------ CUDA
def cuda_model():
    return make_model().cuda()


@pytest.mark.cuda
@pytest.mark.parametrize('stag', [None, STAG])
def test_cuda_graph_equals_the_eager_step(stag):
    """Real graphs: TENT (+STAG) with capturable Adam, eager against
    graphed, over two input shapes; the same predictions, statistics and
    parameters to float32 rounding."""
    opt = dict(type='Adam', lr=1e-3, capturable=True)
    eager = TENT(stag=stag, optimizer=opt)
    eager.configure(cuda_model(), ADAPTER)
    method = TENT(stag=stag, optimizer=opt)
    graphs = CUDAGraphStep(method)
    method.configure(cuda_model(), ADAPTER)
    for x in stream_of_batches():
        x = x.cuda()
        want, want_stats = eager.adapt(Batch(x))
        got, got_stats = method.adapt(Batch(x), replay=graphs)
        torch.testing.assert_close(got.value, want.value, rtol=1e-5,
                                   atol=1e-6)
        for key, value in want_stats.items():
            assert float(got_stats[key]) == pytest.approx(float(value),
                                                          rel=1e-5), key
    assert len(graphs.graphs) == 2
    for p, q in zip(method.model.parameters(), eager.model.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)


def cotta_bench(device):
    """The step benchmark's tiny SegFormer (b0 at 128x64) on ``device``, and
    a function making a batch with the ACDC config's 14 views of a random
    image, the i-th of a fixed sequence."""
    import argparse
    import os.path as osp

    from benchmarks import step_benchmark
    repo = osp.dirname(osp.dirname(osp.dirname(osp.dirname(
        osp.abspath(__file__)))))
    args = argparse.Namespace(size=(128, 64), cls_size=32, batch_size=1,
                              ori_size=(128, 64))
    task = step_benchmark.BenchTask('b0', args, device, repo)
    gen = torch.Generator().manual_seed(3)

    def view_batch():
        image = torch.randint(0, 256, (3, 64, 128), dtype=torch.uint8,
                              generator=gen)
        return step_benchmark.view_batch(task.segmentor, image, repo)
    return task, view_batch


def assert_same_student_and_teacher(method, eager, **tolerance):
    for a, b in ((method.model, eager.model),
                 (method.teacher, eager.teacher)):
        for (name, p), (_, q) in zip(a.named_parameters(),
                                     b.named_parameters()):
            torch.testing.assert_close(p, q, msg=name, **tolerance)


def test_stand_in_graph_of_segmentation_cotta_equals_its_eager_step(
        stand_in_cuda):
    """Segmentation CoTTA (its teacher on the ACDC config's 14 views, the
    restore mask drawn on the device) replayed: the batch's views are the
    graph's inputs too (a static copy, the main view sharing the batch's
    images); the same labels, statistics, student and teacher as eager,
    step for step, over a stream of view batches of one size."""
    task, view_batch = cotta_bench('cpu')
    options = dict(restore_on_device=True, batch_views=True,
                   restore_prob=0.3, optimizer=dict(type='SGD', lr=0.5))
    eager, _ = task.make_method('cotta', STAG, **options)
    method, _ = task.make_method('cotta', STAG, **options)
    graphs = graphed(method, None)
    for i in range(4):
        batch = view_batch()
        assert len(batch.views) == 14
        assert batch.views[batch.main_view].inputs is batch.inputs
        results = []
        for m, step in ((eager, None), (method, graphs)):
            torch.manual_seed(100 + i)  # the same restore masks
            results.append(m.adapt(batch, replay=step))
        (want, want_stats), (got, got_stats) = results
        assert torch.equal(got.value, want.value)
        for key, value in want_stats.items():
            assert float(got_stats[key]) == pytest.approx(float(value),
                                                          rel=1e-6), key
    assert len(graphs.captures) == 1 and graphs.captures[0].replays == 2
    # the images and the 13 other views, each copied before a replay
    (captured, ) = graphs.graphs.values()
    assert len(captured.inputs) == 14
    assert captured.inputs[0] is not batch.inputs
    assert method.t == eager.t == 4
    assert_same_student_and_teacher(method, eager, rtol=1e-6, atol=1e-7)
    # what a capture needs: nothing in the step waits for the device
    counter = HostSyncCounter()
    with counter:
        eager.forward_and_adapt(batch, None)
    assert counter.calls == []


def test_segmentation_cotta_graph_needs_the_restore_on_the_device():
    from mmseg_stag.segmentation import SegmentationCoTTA
    with pytest.raises(ValueError, match='restore_on_device=True'):
        CUDAGraphStep(SegmentationCoTTA())
    on_device = SegmentationCoTTA(restore_on_device=True)
    CUDAGraphStep(on_device)
    assert on_device.optimizer_cfg['capturable'] is True
    CUDAGraphStep(SegmentationCoTTA(restore_prob=0.0))  # nothing drawn


def updates(method, before):
    """Each parameter's change since ``before`` (student, then teacher)."""
    return torch.cat([(p.detach() - q).flatten() for p, q in zip(
        params_of(method), before)])


def momenta(method):
    """The optimizer's momentum buffers, one vector (zeros before its
    first step)."""
    return torch.cat([
        method.optimizer.state[p]['momentum_buffer'].flatten()
        if 'momentum_buffer' in method.optimizer.state.get(p, {})
        else torch.zeros_like(p).flatten()
        for p in method.model.parameters()])


def params_of(method):
    return [p for m in (method.model, method.teacher)
            for p in m.parameters()]


@pytest.mark.cuda
@pytest.mark.parametrize('stag,restore_prob', [(STAG, 0.0), (None, 1.0)])
def test_cuda_graph_of_segmentation_cotta_equals_its_eager_step(
        stag, restore_prob):
    """Real graphs: segmentation CoTTA with its device options (14 teacher
    views in 7 passes, the restore drawn on the GPU), eager against
    replayed on a tiny SegFormer, step by step from one state: before each
    step the eager method takes the graphed one's student, teacher and
    optimizer state. From one state: the same labels (but near-ties) and
    losses; the step's change of student, teacher and optimizer state to
    1e-3 of its size. Not run after run: the backward adds with atomics,
    and this random model's labels are near-ties, so two eager runs on the
    H100 already differ in the second step's loss by 1e-4 (SGD; more with
    Adam; 2026-11-27) and apart further with each step. The restore is
    drawn either way; at probability 0 or 1 its outcome does not depend on
    where the random stream stands."""
    task, view_batch = cotta_bench('cuda')
    options = dict(restore_on_device=True, batch_views=True,
                   restore_prob=restore_prob,
                   optimizer=dict(type='SGD', lr=0.01, momentum=0.9))
    eager, _ = task.make_method('cotta', stag, **options)
    # the graphed arm: its CUDAGraphStep built before configure
    method, _ = task.make_method('cotta_graph', stag, **options)
    graphs = method.bench_step
    for i in range(6):  # 2 eager warm-up steps, a capture, 3 replays
        for a, b in ((eager.model, method.model),
                     (eager.teacher, method.teacher)):
            a.load_state_dict(b.state_dict())
        if i:  # a copy: load_state_dict keeps the given tensors
            eager.optimizer.load_state_dict(copy.deepcopy(
                method.optimizer.state_dict()))
        before = [p.detach().clone() for p in params_of(method)]
        momentum = momenta(method)
        batch = view_batch()
        (want, want_stats), (got, got_stats) = (
            eager.adapt(batch), method.adapt(batch, replay=graphs))
        assert (got.value == want.value).float().mean() > 0.999, i
        for key, value in want_stats.items():
            assert float(got_stats[key]) == pytest.approx(
                float(value), rel=1e-4, abs=1e-6), (i, key)
        want_change, got_change = updates(eager, before), updates(method,
                                                                  before)
        assert float(want_change.norm()) > 0, i
        assert float((got_change - want_change).norm()) <= \
            1e-3 * float(want_change.norm()), i
        want_change, got_change = (momenta(m) - momentum
                                   for m in (eager, method))
        assert float((got_change - want_change).norm()) <= \
            1e-3 * float(want_change.norm()), i
    assert len(graphs.graphs) == 1
