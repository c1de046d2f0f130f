"""``OnlineAdaptationLoop`` through MMEngine's ``Runner`` with the real
configs (plain ``EncoderDecoder``), shrunk to a tiny MiT and tiny images:
one forward and at most one backward per batch, predict-then-adapt, which
parameters move, the STAG term, the log lines, and errors before the first
batch."""
import copy
import glob
import math
import os
import os.path as osp
import shutil

import numpy as np
import pytest
import torch
from mmengine.hooks import Hook
from seg_helpers import (NVLABS_SEG_CFG, SEG_CFG, build_from_config,
                         fresh_model, make_runner, tiny_options)

from mmseg_stag import stag
from mmseg_stag.core import select_parameters
from mmseg_stag.engine import online_loop
from mmseg_stag.engine.launch_guard import DISTRIBUTED_ERROR

CLASSIFIER = 'decode_head.conv_seg'
SLIDE = dict(mode='slide', crop_size=(32, 32), stride=(24, 24))


class StreamRecorder(Hook):
    """Watches the loop from outside: calls of the classifier (a forward
    hook) and backward passes (``torch.autograd.backward``, which
    ``Tensor.backward`` calls) at the end of each batch, whether the head
    outputs carried a graph, and the first batches with their outputs."""

    priority = 'LOWEST'

    def __init__(self, model, monkeypatch, keep=2):
        self.forwards = self.backwards = 0
        self.totals = []  # (forwards, backwards) after each batch
        self.with_graph = []  # requires_grad of each classifier output
        self.batches, self.outputs = [], []
        self.keep = keep
        model.get_submodule(CLASSIFIER).register_forward_hook(self._forward)
        backward = torch.autograd.backward

        def counted_backward(*args, **kwargs):
            self.backwards += 1
            return backward(*args, **kwargs)

        monkeypatch.setattr(torch.autograd, 'backward', counted_backward)

    def _forward(self, module, args, output):
        self.forwards += 1
        self.with_graph.append(output.requires_grad)

    def after_test_iter(self, runner, batch_idx, data_batch=None,
                        outputs=None):
        self.totals.append((self.forwards, self.backwards))
        if batch_idx < self.keep:
            self.batches.append(copy.deepcopy(data_batch))
            self.outputs.append(outputs[0].clone())

    def per_batch(self):
        """``(classifier calls, backward passes)`` of each batch."""
        before = [(0, 0)] + self.totals[:-1]
        return [(f - f0, b - b0)
                for (f, b), (f0, b0) in zip(self.totals, before)]


def snapshot(model):
    return {k: v.detach().clone() for k, v in model.named_parameters()}


def changed(model, before):
    return {k for k, v in model.named_parameters()
            if not torch.equal(v, before[k])}


class Run:
    """One stream through ``runner.test()``, recorded."""

    def __init__(self, method, tiny_acdc, checkpoint, work_dir, monkeypatch,
                 **kwargs):
        self.runner = make_runner(method, tiny_acdc, checkpoint, work_dir,
                                  **kwargs)
        self.model = self.runner.model
        self.before = snapshot(self.model)
        self.recorder = StreamRecorder(self.model, monkeypatch)
        self.runner.register_hook(self.recorder)
        self.metrics = self.runner.test()
        self.method = self.runner.test_loop.method
        self.device = next(self.model.parameters()).device

    def scalars(self):
        return self.runner.message_hub.log_scalars

    def log_lines(self):
        path = osp.join(self.runner.log_dir, f'{self.runner.timestamp}.log')
        with open(path) as f:
            return [line for line in f if 'Iter(test) [' in line]


def unadapted_outputs(run, config, method, tiny_acdc, checkpoint,
                      extra=None):
    """What MMSeg's own test step predicts for the run's first batch with
    the checkpoint's weights: the prediction before any adaptation."""
    model, _ = fresh_model(config, method, tiny_acdc, checkpoint,
                           run.device, extra)
    with torch.no_grad():
        return model, model.test_step(run.recorder.batches[0])


# ------------------------------------------------------------------ methods
def test_source_changes_nothing_and_never_backprops(tiny_acdc,
                                                    tiny_checkpoint,
                                                    tmp_path, monkeypatch):
    run = Run('source', tiny_acdc, tiny_checkpoint, tmp_path, monkeypatch)
    assert changed(run.model, run.before) == set()
    assert run.recorder.per_batch() == [(1, 0)] * 8
    assert not any(run.recorder.with_graph)  # no graph without updates
    assert run.method.params == [] and run.method.num_updates == 0
    assert set(run.metrics) >= {'continual/mIoU_mean_over_stages',
                                'continual/r1_fog'}


def test_bn_adapt_never_backprops_and_uses_batch_stats(tiny_acdc,
                                                       tiny_checkpoint,
                                                       tmp_path,
                                                       monkeypatch):
    run = Run('bn-adapt', tiny_acdc, tiny_checkpoint, tmp_path, monkeypatch)
    assert changed(run.model, run.before) == set()
    assert run.recorder.per_batch() == [(1, 0)] * 8
    assert not any(run.recorder.with_graph)
    bn = run.model.decode_head.fusion_conv.bn
    assert bn.training and bn.running_mean is None


@pytest.mark.parametrize('method', ['tent', 'tent-stag'])
def test_tent_one_forward_one_backward_and_predict_then_adapt(
        method, tiny_acdc, tiny_checkpoint, tmp_path, monkeypatch):
    run = Run(method, tiny_acdc, tiny_checkpoint, tmp_path, monkeypatch)
    model = run.model
    # exactly one forward (one classifier call) and one backward per batch
    assert run.recorder.per_batch() == [(1, 1)] * 8
    assert all(run.recorder.with_graph)
    assert run.method.num_updates == 8
    # only the norm layers' affine parameters are adapted
    selected = {n for n, _ in run.method.params}
    norm_names = {n for n, m in model.named_modules()
                  if isinstance(m, (torch.nn.LayerNorm,
                                    torch.nn.BatchNorm2d))}
    assert selected == {f'{m}.{p}' for m in norm_names
                        for p in ('weight', 'bias')}
    # the stage-final LayerNorms of MMSeg's MiT have no "norm" in their name
    assert 'backbone.layers.0.2.weight' in selected
    assert changed(model, run.before) <= selected
    assert len(changed(model, run.before)) > 0
    # predict-then-adapt: the first prediction is the unadapted model's,
    # post-processed to the original size
    first = run.recorder.outputs[0]
    _, expected = unadapted_outputs(run, SEG_CFG, method, tiny_acdc,
                                    tiny_checkpoint)
    assert first.pred_sem_seg.shape == (48, 96)
    torch.testing.assert_close(first.seg_logits.data,
                               expected[0].seg_logits.data)
    assert torch.equal(first.pred_sem_seg.data, expected[0].pred_sem_seg.data)


@pytest.mark.parametrize('method', ['tent', 'tent-stag'])
def test_loop_logs_the_method_scalars(method, tiny_acdc, tiny_checkpoint,
                                      tmp_path, monkeypatch):
    """OnlineAdaptationLogProcessor prints loss (and loss_stag, beta with
    STAG) in every test log line; the message hub holds them."""
    run = Run(method, tiny_acdc, tiny_checkpoint, tmp_path, monkeypatch)
    # one line per batch, then the epoch's line with the metrics
    iters = [line for line in run.log_lines()
             if 'continual/mIoU' not in line]
    assert len(iters) == 8
    scalars = run.scalars()
    for k, line in enumerate(iters):
        assert f'[{k + 1}/8]' in line
        assert 'loss: ' in line and 'loss_base: ' in line
        if method == 'tent-stag':
            # beta_t of the batch's own update: beta0 exp(-t / gamma), t
            # restarting with each stage (two images a stage here)
            beta = stag.stag_beta(500.0, 35.0, k % 2)
            assert f'beta: {beta:.4f}' in line
            assert 'loss_stag: ' in line
        else:
            assert 'beta' not in line and 'loss_stag' not in line
    assert {'test/loss', 'test/loss_base'} <= set(scalars)
    if method == 'tent-stag':
        assert scalars['test/beta'].current() == pytest.approx(
            stag.stag_beta(500.0, 35.0, 1))
        stats = {k: scalars[f'test/{k}'].current()
                 for k in ('loss', 'loss_base', 'loss_stag', 'beta')}
        assert stats['loss'] == pytest.approx(
            stats['loss_base'] + stats['beta'] * stats['loss_stag'],
            rel=1e-5)
    else:
        assert 'test/beta' not in scalars


@pytest.mark.parametrize('restart', [True, False])
def test_stage_tags_reach_the_method(restart, tiny_acdc, tiny_checkpoint,
                                     tmp_path, monkeypatch):
    """The loop hands each batch's stage to the method: with
    ``stage_restart`` naming ``'beta_t'`` (the ACDC configs) beta_t restarts
    at beta0 on every stage (two images a stage here), without it t runs
    on."""
    restarts = ('optimizer', 'beta_t') if restart else ('optimizer', )
    run = Run('tent-stag', tiny_acdc, tiny_checkpoint, tmp_path, monkeypatch,
              extra={'test_cfg.method.stage_restart': restarts})
    assert run.method.stage_index == 3 and run.method.num_updates == 8
    lines = [line for line in run.log_lines()
             if 'continual/mIoU' not in line]
    steps = (0, 1) * 4 if restart else range(8)
    betas = [stag.stag_beta(500.0, 35.0, t) for t in steps]
    assert len(lines) == 8
    for line, beta in zip(lines, betas):
        assert f'beta: {beta:.4f}' in line


def test_bn_adapt_stag_changes_only_affine_params(tiny_acdc, tiny_checkpoint,
                                                  tmp_path, monkeypatch):
    run = Run('bn-adapt-stag', tiny_acdc, tiny_checkpoint, tmp_path,
              monkeypatch)
    diff = changed(run.model, run.before)
    assert diff and all(n.endswith(('weight', 'bias')) for n in diff)
    affine = {n for n, _ in run.method.params}
    assert diff <= affine
    assert run.recorder.per_batch() == [(1, 1)] * 8
    scalars = run.scalars()
    assert 'test/loss_base' not in scalars  # STAG alone: no loss of its own
    assert {'test/loss', 'test/loss_stag', 'test/beta'} <= set(scalars)
    bn = run.model.decode_head.fusion_conv.bn
    assert bn.training and bn.running_mean is None


def test_stag_term_matches_beta_times_stag_loss(tiny_acdc, tiny_checkpoint,
                                                tmp_path, monkeypatch):
    """One TENT+STAG step minus one TENT step (SGD) = -lr * beta_0 * grad of
    STAG's loss computed independently on the head outputs."""
    lr = 0.01
    extra = {'test_cfg.method.optimizer': dict(_delete_=True, type='SGD',
                                               lr=lr),
             'test_dataloader.dataset.indices': 1}  # one batch
    deltas = {}
    for method in ('tent', 'tent-stag'):
        run = Run(method, tiny_acdc, tiny_checkpoint, tmp_path / method,
                  monkeypatch, extra=extra)
        assert run.recorder.per_batch() == [(1, 1)]
        deltas[method] = {k: v.detach() - run.before[k]
                          for k, v in run.model.named_parameters()}
    batch = run.recorder.batches[0]
    model, cfg = fresh_model(SEG_CFG, 'tent-stag', tiny_acdc,
                             tiny_checkpoint, run.device)
    data = model.data_preprocessor(batch, False)
    metas = [s.metainfo for s in data['data_samples']]
    classifier = model.get_submodule(CLASSIFIER)
    seen = []
    hook = classifier.register_forward_hook(
        lambda m, args, out: seen.append((args[0], out)))
    model.inference(data['inputs'], metas)
    hook.remove()
    ((features, logits), ) = seen
    l_stag = stag.stag_loss(features, logits, classifier.weight,
                            classifier.bias)
    names = sorted(deltas['tent'])
    params = dict(model.named_parameters())
    grads = torch.autograd.grad(l_stag, [params[n] for n in names],
                                allow_unused=True)
    beta0 = cfg.test_cfg['method']['stag']['beta0']
    adapted = {n for n, _ in select_parameters(model)}
    nonzero = 0
    for name, grad in zip(names, grads):
        diff = deltas['tent-stag'][name] - deltas['tent'][name]
        if name not in adapted:
            assert torch.all(diff == 0), name
            continue
        expected = -lr * beta0 * grad
        torch.testing.assert_close(diff, expected, rtol=2e-3, atol=1e-6)
        nonzero += int(expected.abs().max() > 0)
    assert nonzero > 0


def test_slide_inference_predicts_then_adapts(tiny_acdc, tiny_checkpoint,
                                              tmp_path, monkeypatch):
    """Sliding-window inference: every crop's head outputs come from the one
    forward pass; the batch is evaluated on the prediction made before the
    update and the next batch sees the adapted model."""
    extra = {'model.test_cfg': SLIDE,
             'test_cfg.method.loss': 'entropy',  # per crop, at head size
             'test_cfg.method.optimizer': dict(_delete_=True, type='SGD',
                                               lr=0.5)}
    run = Run('tent', tiny_acdc, tiny_checkpoint, tmp_path, monkeypatch,
              extra=extra)
    # 32x64 input, 32x32 crops, stride 24: 3 crops, 3 classifier calls
    assert run.recorder.per_batch() == [(3, 1)] * 8
    fresh, first = unadapted_outputs(run, SEG_CFG, 'tent', tiny_acdc,
                                     tiny_checkpoint,
                                     {'model.test_cfg': SLIDE})
    ours = run.recorder.outputs[0]
    assert ours.pred_sem_seg.shape == (48, 96)
    torch.testing.assert_close(ours.seg_logits.data, first[0].seg_logits.data)
    assert torch.equal(ours.pred_sem_seg.data, first[0].pred_sem_seg.data)
    # the second batch is predicted by the model adapted on the first
    with torch.no_grad():
        second = fresh.test_step(run.recorder.batches[1])
    assert not torch.allclose(run.recorder.outputs[1].seg_logits.data,
                              second[0].seg_logits.data)
    assert changed(run.model, run.before)
    # the method never enters the model's state dict
    assert set(run.model.state_dict()) == set(fresh.state_dict())


def test_nvlabs_head_config_runs(tiny_acdc, tmp_path, monkeypatch):
    model, _ = build_from_config(NVLABS_SEG_CFG.format('tent-stag'),
                                 tiny_options(tiny_acdc, head='nvlabs'))
    ckpt = tmp_path / 'nv.pth'
    torch.save({'state_dict': model.state_dict()}, ckpt)
    run = Run('tent-stag', tiny_acdc, str(ckpt), tmp_path / 'wd',
              monkeypatch, config=NVLABS_SEG_CFG)
    assert type(run.model.decode_head).__name__ == 'NVSegformerHead'
    assert run.recorder.per_batch() == [(1, 1)] * 8
    assert changed(run.model, run.before)


# ------------------------------------------------------------------- errors
def assert_nothing_ran(recorder, work_dir):
    assert recorder.forwards == 0 and recorder.backwards == 0
    assert recorder.totals == []
    assert not glob.glob(osp.join(str(work_dir), '**', 'continual_results*'),
                         recursive=True)


@pytest.mark.parametrize('problem', ['no_root', 'no_condition', 'no_label',
                                     'classes', 'head'])
def test_bad_input_fails_before_adapting(problem, tiny_acdc, tiny_checkpoint,
                                         tmp_path, monkeypatch):
    root, ckpt, extra = tiny_acdc, tiny_checkpoint, {}
    if problem == 'no_root':
        root, match = str(tmp_path / 'missing'), 'data_root not found'
    elif problem in ('no_condition', 'no_label'):
        root = str(tmp_path / 'acdc')
        shutil.copytree(tiny_acdc, root)
        if problem == 'no_condition':
            shutil.rmtree(osp.join(root, 'rgb_anon', 'rain'))
            match = osp.join('rgb_anon', 'rain', 'train')
        else:
            gt_dir = osp.join(root, 'gt', 'night', 'train')
            victim = sorted(os.listdir(gt_dir))[0]
            first = sorted(os.listdir(osp.join(gt_dir, victim)))[0]
            os.remove(osp.join(gt_dir, victim, first))
            match = 'label missing'
    elif problem == 'classes':
        extra, match = {'model.decode_head.num_classes': 7}, \
            'decode_head.conv_seg.weight'
    else:
        model, _ = build_from_config(NVLABS_SEG_CFG.format('tent'),
                                     tiny_options(tiny_acdc, head='nvlabs'))
        state = {k.replace('conv_seg', 'linear_pred'): v
                 for k, v in model.state_dict().items()}
        ckpt = str(tmp_path / 'nvlabs_raw.pth')
        torch.save({'state_dict': state}, ckpt)
        match = 'does not match'
    work_dir = tmp_path / 'wd'
    with pytest.raises((FileNotFoundError, ValueError), match=match):
        runner = make_runner('tent', root, ckpt, work_dir, extra=extra)
        recorder = StreamRecorder(runner.model, monkeypatch)
        runner.register_hook(recorder)
        runner.test()
    if problem not in ('classes', 'head'):  # the runner was built
        assert_nothing_ran(recorder, work_dir)


@pytest.mark.parametrize('option, error, match', [
    ({'test_cfg.method': dict(_delete_=True, type='tnet')}, KeyError,
     r"unknown method 'tnet'.*'tent'"),
    ({'test_cfg.method': dict(_delete_=True, type='TENT')}, KeyError,
     "unknown method 'TENT'"),
    ({'test_cfg.method': dict(_delete_=True, type='eata')}, ValueError,
     'EATA needs clean source images before the stream .*'
     'test_cfg.source_dataloader'),
    ({'test_cfg.method.loss': 'entropie'}, ValueError,
     "tent loss must be one of .*'entropie'"),
    ({'test_cfg.head_layer': 'decode_head.nope'}, ValueError,
     "no module 'decode_head.nope'"),
    ({'test_cfg.mixed_precision': 'fp8'}, ValueError,
     r"mixed_precision must be one of \['bf16', 'fp16'\] or None, got "
     "'fp8'"),
    ({'test_cfg.head_layer': 'backbone.layers.0.0.projection'}, ValueError,
     r"'backbone.layers.0.0.projection'.*kernel_size=\(7, 7\).*head without "
     'a 1x1 classifier'),
    ({'test_cfg.mixed_precision': 'fp16'}, ValueError,
     r"mixed_precision='fp16' needs a GPU .* use mixed_precision='bf16'"),
    # MMEngine's TestLoop flag: float16 has one name, mixed_precision
    ({'test_cfg.fp16': True}, ValueError,
     r"test_cfg.fp16=True: write mixed_precision='fp16'"),
    ({'test_cfg.graph_warmup': 3}, ValueError,
     r'graph_warmup=3 does nothing without test_cfg.cuda_graph=True'),
    ({'test_cfg.task': 'classification'}, ValueError,
     r"test_cfg.task='classification' but the model is a EncoderDecoder"),
    # BatchNorm statistics have one place: the method's option
    ({'test_cfg.bn_batch_stats': True}, ValueError,
     r'test_cfg.bn_batch_stats is now the method.s option: write '
     r'test_cfg.method.bn_batch_stats=True'),
    ({'test_cfg.method.fresh_optimizer_per_stage': False}, ValueError,
     r'fresh_optimizer_per_stage is now stage_restart'),
    # clean source images a method does not read: refused, not dropped
    ({'test_cfg.source_dataloader': dict(batch_size=1)}, ValueError,
     r'TENT, as configured, takes no clean source images .* nothing reads '
     r'test_cfg.source_dataloader'),
    ({'test_cfg.method': dict(_delete_=True, type='eata', fisher_alpha=0),
      'test_cfg.source_dataloader': dict(batch_size=1)}, ValueError,
     r'EATA, as configured, takes no clean source images .* nothing reads '
     r'test_cfg.source_dataloader'),
], ids=['unknown-method', 'upper-case-name', 'eata-without-source-data',
        'bad-option', 'no-such-classifier', 'bad-mixed-precision',
        'classifier-not-1x1', 'fp16-on-the-cpu', 'mmengine-fp16-flag',
        'graph-warmup-without-graph', 'classification-task',
        'loop-bn-batch-stats', 'renamed-fresh-optimizer',
        'source-data-for-tent', 'source-data-for-eta'])
def test_config_error_fails_before_the_first_batch(option, error, match,
                                                   tiny_acdc,
                                                   tiny_checkpoint, tmp_path,
                                                   monkeypatch):
    runner = make_runner('tent', tiny_acdc, tiny_checkpoint, tmp_path,
                         extra=option)
    recorder = StreamRecorder(runner.model, monkeypatch)
    runner.register_hook(recorder)
    with pytest.raises(error, match=match):
        runner.test()
    assert_nothing_ran(recorder, tmp_path)


def test_a_classification_stream_for_a_segmentor_is_refused(
        tiny_acdc, tiny_checkpoint, tmp_path, monkeypatch):
    """The task is the model's: a segmentor given a classification stream
    (or the reverse, tests/classification) fails before the first batch,
    naming both."""
    root = tmp_path / 'cifar-c'
    root.mkdir()
    np.save(root / 'labels.npy', np.zeros(8, dtype=np.int64))
    np.save(root / 'fog.npy', np.zeros((8, 32, 32, 3), dtype=np.uint8))
    stream = dict(
        _delete_=True, batch_size=1, num_workers=0,
        sampler=dict(type='DefaultSampler', shuffle=False),
        collate_fn=dict(type='pseudo_collate'),
        dataset=dict(type='mmseg_stag.CorruptionStream', corruptions=['fog'],
                     corruption_set=dict(type='CIFARC', data_root=str(root),
                                         severities=(5, ))))
    runner = make_runner('tent', tiny_acdc, tiny_checkpoint, tmp_path,
                         extra={'test_dataloader': stream})
    recorder = StreamRecorder(runner.model, monkeypatch)
    runner.register_hook(recorder)
    with pytest.raises(ValueError, match='test_dataloader.dataset is a '
                       'classification stream .* but the model is a '
                       'segmentation model'):
        runner.test()
    assert_nothing_ran(recorder, tmp_path)


def test_distributed_guard(tiny_acdc, tiny_checkpoint, tmp_path,
                           monkeypatch):
    """World size > 1: the loop refuses to split the stream (the torchrun
    run is in tests/segmentation/engine/test_online_loop_scripts.py)."""
    monkeypatch.setattr(online_loop, 'get_world_size', lambda: 2)
    runner = make_runner('tent', tiny_acdc, tiny_checkpoint, tmp_path)
    recorder = StreamRecorder(runner.model, monkeypatch)
    runner.register_hook(recorder)
    with pytest.raises(RuntimeError) as err:
        runner.test()
    assert DISTRIBUTED_ERROR.format(n=2) in str(err.value)
    assert 'cannot be split across 2 ranks' in str(err.value)
    assert_nothing_ran(recorder, tmp_path)


def test_bf16_mixed_precision(tiny_acdc, tiny_checkpoint, tmp_path):
    """``mixed_precision='bf16'``: the forward runs in bfloat16, the STAG
    term and the parameters stay float32, and the stream's numbers stay
    close to the float32 run's."""
    results = {}
    for mode in (None, 'bf16'):
        runner = make_runner('tent-stag', tiny_acdc, tiny_checkpoint,
                             tmp_path / str(mode),
                             extra={'test_cfg.mixed_precision': mode})
        seen = []
        conv = runner.model.decode_head.conv_seg
        conv.register_forward_hook(lambda m, i, o: seen.append(o.dtype))
        results[mode] = runner.test()
        expected = torch.bfloat16 if mode else torch.float32
        assert seen and set(seen) == {expected}
        assert all(p.dtype == torch.float32
                   for p in runner.model.parameters())
    for key, value in results[None].items():
        assert abs(results['bf16'][key] - value) < 5.0, key


def test_a_non_finite_stag_loss_of_sar_stops_the_run_naming_the_batch(
        tiny_acdc, tiny_checkpoint, tmp_path, monkeypatch):
    """SAR+STAG makes two passes a batch, each with its STAG term: a
    non-finite term of the second pass of batch 2 stops the run there."""
    from mmseg_stag.core import STAGLoss
    forward, calls = STAGLoss.forward, []

    def nan_at_batch_2_pass_2(self, *args, **kwargs):
        loss = forward(self, *args, **kwargs)
        calls.append(1)
        return loss * math.nan if len(calls) == 6 else loss

    monkeypatch.setattr(STAGLoss, 'forward', nan_at_batch_2_pass_2)
    runner = make_runner('sar-stag', tiny_acdc, tiny_checkpoint, tmp_path)
    with pytest.raises(ValueError, match='loss_stag2 is nan at batch 2'):
        runner.test()
    assert len(calls) >= 6
