"""Continual Cityscapes->ACDC through MMSeg's Runner and ``tools/test.py``
with the real configs, shrunk to a tiny MiT and tiny images."""
import copy
import json
import os
import os.path as osp
import subprocess
import sys
import uuid

import pytest
import torch
from conftest import REPO, as_cli, build_from_config, tiny_options
from mmengine.config import Config
from mmengine.runner import Runner

from mmseg_stag import stag
from mmseg_stag.checkpoint import load_segmentor_checkpoint

CFG = 'configs/stag_acdc/segformer_mit-b5_acdc-continual_{}.py'
NVLABS_CFG = 'configs/stag_acdc/segformer_mit-b5-nvlabs_acdc-continual_{}.py'


def make_runner(method, data_root, checkpoint, work_dir, config=CFG,
                extra=None, rounds=1):
    cfg = Config.fromfile(osp.join(REPO, config.format(method)))
    opts = tiny_options(data_root, rounds=rounds,
                        head='nvlabs' if 'nvlabs' in config else 'mmseg')
    opts.update(extra or {})
    cfg.merge_from_dict(opts)
    cfg.work_dir = str(work_dir)
    cfg.experiment_name = f'test_{uuid.uuid4().hex[:8]}'
    runner = Runner.from_cfg(cfg)
    load_segmentor_checkpoint(runner.model, checkpoint)
    return runner


class Probe:
    """Counts head forwards and backward passes; records the first batch
    and its prediction."""

    def __init__(self, model):
        self.forwards = 0
        self.backwards = 0
        self.first = None
        self.first_pred = None
        head_forward = model.decode_head.forward

        def counted_forward(*args, **kwargs):
            self.forwards += 1
            return head_forward(*args, **kwargs)

        model.decode_head.forward = counted_forward
        predict = model.predict

        def recorded_predict(inputs, data_samples=None):
            out = predict(inputs, data_samples)
            if self.first is None:
                self.first = (inputs.clone(), copy.deepcopy(data_samples))
                self.first_pred = out[0].pred_sem_seg.data.clone()
            return out

        model.predict = recorded_predict
        self._model = model

    def watch_backward(self, monkeypatch):
        backward = torch.autograd.backward

        def counted_backward(*args, **kwargs):
            self.backwards += 1
            return backward(*args, **kwargs)

        # Tensor.backward calls torch.autograd.backward
        monkeypatch.setattr(torch.autograd, 'backward', counted_backward)


def snapshot(model):
    return {k: v.detach().clone() for k, v in model.named_parameters()}


def changed(model, before):
    return {k for k, v in model.named_parameters()
            if not torch.equal(v, before[k])}


def run(method, tiny_acdc, tiny_checkpoint, tmp_path, **kwargs):
    runner = make_runner(method, tiny_acdc, tiny_checkpoint, tmp_path,
                         **kwargs)
    model = runner.model
    before = snapshot(model)
    probe = Probe(model)
    with pytest.MonkeyPatch.context() as monkeypatch:
        probe.watch_backward(monkeypatch)
        metrics = runner.test()
    return runner, model, before, probe, metrics


def test_tools_test_py_end_to_end(tiny_acdc, tiny_checkpoint, tmp_path):
    work_dir = tmp_path / 'wd'
    cmd = [sys.executable, osp.join(REPO, 'tools/test.py'),
           osp.join(REPO, CFG.format('tent-stag')), tiny_checkpoint,
           '--work-dir', str(work_dir), '--cfg-options'] + as_cli(
               tiny_options(tiny_acdc, rounds=2))
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for name in ('continual_results.json', 'continual_results.csv',
                 'continual_miou.png', 'continual_results.partial.jsonl'):
        assert (work_dir / name).is_file(), name
    results = json.loads((work_dir / 'continual_results.json').read_text())
    stages = results['stages']
    assert [s['stage'] for s in stages] == list(range(8))
    assert [s['condition'] for s in stages[:4]] == ['fog', 'night', 'rain',
                                                    'snow']
    assert [s['round'] for s in stages] == [1] * 4 + [2] * 4
    assert len(stages[0]['per_class_IoU']) == 19
    assert results['mean_mIoU'] == pytest.approx(
        sum(s['mIoU'] for s in stages) / 8)
    csv_rows = (work_dir / 'continual_results.csv').read_text().splitlines()
    assert len(csv_rows) == 9
    partial = (work_dir / 'continual_results.partial.jsonl').read_text()
    assert len(partial.splitlines()) == 8
    # the table and the TTA log lines reach the user
    log = proc.stdout + proc.stderr
    assert 'Round |    fog |  night |   rain |   snow' in log
    assert 'loss_stag' in log and 'beta' in log


def test_source_changes_nothing_and_never_backprops(tiny_acdc,
                                                    tiny_checkpoint,
                                                    tmp_path):
    _, model, before, probe, _ = run('source', tiny_acdc, tiny_checkpoint,
                                     tmp_path)
    assert changed(model, before) == set()
    assert probe.forwards == 8 and probe.backwards == 0


def test_bn_adapt_never_backprops_and_uses_batch_stats(tiny_acdc,
                                                       tiny_checkpoint,
                                                       tmp_path):
    _, model, before, probe, _ = run('bn-adapt', tiny_acdc, tiny_checkpoint,
                                     tmp_path)
    assert changed(model, before) == set()
    assert probe.forwards == 8 and probe.backwards == 0
    bn = model.decode_head.fusion_conv.bn
    assert bn.training and bn.running_mean is None


def test_tent_one_forward_one_backward_and_only_norm_params(
        tiny_acdc, tiny_checkpoint, tmp_path):
    runner, model, before, probe, _ = run('tent', tiny_acdc,
                                          tiny_checkpoint, tmp_path)
    selected = {n for n, _ in model.tta_adapter.params}
    norm_names = {n for n, m in model.named_modules()
                  if isinstance(m, (torch.nn.LayerNorm,
                                    torch.nn.BatchNorm2d))}
    assert selected == {f'{m}.{p}' for m in norm_names
                        for p in ('weight', 'bias')}
    # the stage-final LayerNorms of MMSeg's MiT have no "norm" in their name
    assert 'backbone.layers.0.2.weight' in selected
    assert changed(model, before) <= selected
    assert len(changed(model, before)) > 0
    assert probe.forwards == 8 and probe.backwards == 8
    assert model.tta_adapter.num_updates == 8
    # predict-then-adapt: the first prediction is the unadapted model's
    fresh, _ = build_from_config(CFG.format('tent'), tiny_options(tiny_acdc))
    load_segmentor_checkpoint(fresh, tiny_checkpoint)
    fresh.eval()
    inputs, data_samples = probe.first
    with torch.no_grad():
        expected = fresh.predict(inputs, data_samples)[0].pred_sem_seg.data
    assert torch.equal(probe.first_pred, expected)


def test_bn_adapt_stag_changes_only_affine_params(tiny_acdc, tiny_checkpoint,
                                                  tmp_path):
    _, model, before, probe, _ = run('bn-adapt-stag', tiny_acdc,
                                     tiny_checkpoint, tmp_path)
    diff = changed(model, before)
    assert diff and all(n.endswith(('weight', 'bias')) for n in diff)
    affine = {n for n, _ in model.tta_adapter.params}
    assert diff <= affine
    assert probe.forwards == 8 and probe.backwards == 8
    assert 'loss_base' not in model.tta_adapter.last_stats


def test_stag_term_matches_beta_times_stag_loss(tiny_acdc, tiny_checkpoint,
                                                tmp_path):
    """One TENT+STAG step minus one TENT step (SGD) = -lr * beta_0 * grad of
    STAGLoss computed independently on the wrapper's head outputs."""
    lr = 0.01
    sgd = {'custom_hooks.0.optimizer': dict(_delete_=True, type='SGD', lr=lr)}
    deltas = {}
    for method in ('tent', 'tent-stag'):
        runner = make_runner(method, tiny_acdc, tiny_checkpoint,
                             tmp_path / method, extra=sgd)
        runner.model.eval()
        hook = [h for h in runner.hooks if type(h).__name__ == 'TTAHook'][0]
        hook.before_test(runner)
        batch = next(iter(runner.build_dataloader(runner.cfg.test_dataloader)))
        before = snapshot(runner.model)
        with torch.no_grad():
            runner.model.test_step(batch)
        deltas[method] = {k: v.detach() - before[k]
                          for k, v in runner.model.named_parameters()}
    model, cfg = build_from_config(CFG.format('tent-stag'),
                                   tiny_options(tiny_acdc))
    load_segmentor_checkpoint(model, tiny_checkpoint)
    model.eval()
    data = model.data_preprocessor(batch, False)
    metas = [s.metainfo for s in data['data_samples']]
    _, head_outputs = model.inference_with_features(data['inputs'], metas)
    ((features, logits), ) = head_outputs
    l_stag = stag.stag_loss(features, logits, model.classifier.weight,
                            model.classifier.bias)
    names = sorted(deltas['tent'])
    params = dict(model.named_parameters())
    grads = torch.autograd.grad(l_stag, [params[n] for n in names],
                                allow_unused=True)
    beta0 = cfg.custom_hooks[0]['stag']['beta0']
    nonzero = 0
    for name, grad in zip(names, grads):
        diff = deltas['tent-stag'][name] - deltas['tent'][name]
        if name not in {n for n, _ in
                        __import__('mmseg_stag').methods.select_parameters(
                            model)}:
            assert torch.all(diff == 0), name
            continue
        expected = -lr * beta0 * grad
        torch.testing.assert_close(diff, expected, rtol=2e-3, atol=1e-6)
        nonzero += int(expected.abs().max() > 0)
    assert nonzero > 0


def test_same_seed_same_stage_miou(tiny_acdc, tiny_checkpoint, tmp_path):
    scores = []
    for i in range(2):
        _, _, _, _, metrics = run('tent-stag', tiny_acdc, tiny_checkpoint,
                                  tmp_path / str(i), rounds=2)
        scores.append(json.loads(
            (tmp_path / str(i) / 'continual_results.json').read_text()))
    assert [s['mIoU'] for s in scores[0]['stages']] == \
        [s['mIoU'] for s in scores[1]['stages']]


def test_nvlabs_head_config_runs(tiny_acdc, tmp_path):
    model, _ = build_from_config(NVLABS_CFG.format('tent-stag'),
                                 tiny_options(tiny_acdc, head='nvlabs'))
    ckpt = tmp_path / 'nv.pth'
    torch.save({'state_dict': model.state_dict()}, ckpt)
    _, model, before, probe, _ = run('tent-stag', tiny_acdc, str(ckpt),
                                     tmp_path / 'wd', config=NVLABS_CFG)
    assert type(model.decode_head).__name__ == 'NVSegformerHead'
    assert probe.forwards == 8 and probe.backwards == 8
    assert changed(model, before)


@pytest.mark.parametrize('problem', ['no_root', 'no_condition', 'no_label',
                                     'classes', 'head'])
def test_bad_input_fails_before_adapting(problem, tiny_acdc, tiny_checkpoint,
                                         tmp_path):
    import shutil
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
        model, _ = build_from_config(NVLABS_CFG.format('tent'),
                                     tiny_options(tiny_acdc, head='nvlabs'))
        state = {k.replace('conv_seg', 'linear_pred'): v
                 for k, v in model.state_dict().items()}
        ckpt = str(tmp_path / 'nvlabs_raw.pth')
        torch.save({'state_dict': state}, ckpt)
        match = 'does not match'
    with pytest.raises((FileNotFoundError, ValueError), match=match):
        runner = make_runner('tent', root, ckpt, tmp_path / 'wd',
                             extra=extra)
        runner.test()


def test_classifier_must_be_a_1x1_conv(tiny_acdc):
    with pytest.raises(ValueError, match="'decode_head.nope'"):
        build_from_config(CFG.format('tent'), dict(
            tiny_options(tiny_acdc), **{'model.classifier_name':
                                        'decode_head.nope'}))
    with pytest.raises(ValueError, match='1x1'):
        build_from_config(CFG.format('tent'), dict(
            tiny_options(tiny_acdc), **{'model.classifier_name':
                                        'backbone.layers.0.0.projection'}))
