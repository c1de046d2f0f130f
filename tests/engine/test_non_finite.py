"""A non-finite step stops the run: a nan put into a method's loss at batch
k stops ``runner.test()`` naming the method, the statistic, batch k and its
image, before any result or run state that includes batch k is written;
the stages finished before stay written and resumable. Every method ± STAG
(segmentation here, the classification stream in
tests/classification/test_cls_non_finite.py)."""
import os.path as osp
import re

import pytest
import torch
from seg_helpers import make_runner

from mmseg_stag.engine.run_state import STATE_FILE
from mmseg_stag.segmentation.methods.hybrid_tta import TuningSwitch

#: the first batch of the third stage is 4 (2 images a stage); k is the
#: stage's second: the stage's first batch was finite, nothing of it written
K = 5
#: the logger reads the statistics at its interval: past the stream's 8
#: batches, so only the stages' ends read them (the stop is not a log's)
LONG_INTERVAL = {'default_hooks.logger.interval': 50}
NO_FISHER = {'test_cfg.method.fisher_alpha': 0.0,
             'test_cfg.source_dataloader': None}
#: CoTTA's augmented views need images the tiny MiT can take at 0.5x
COTTA = {'test_dataloader.dataset.pipeline.1.scale': (128, 64),
         'test_dataloader.dataset.pipeline.1.ratios': [0.5, 1.0, 1.5]}


def nan_from_batch(monkeypatch, runner, k, target='add_stag'):
    """Make the method's loss nan at batch ``k`` (the loop's ``run_iter``
    tells the batch): its base loss as ``add_stag`` receives it, or what
    the adapter's ``target`` returns."""
    loop = runner.test_loop
    at = {'batch': None}
    run_iter = loop.run_iter

    def counted(idx, data_batch):
        at['batch'] = idx
        return run_iter(idx, data_batch)

    monkeypatch.setattr(loop, 'run_iter', counted)
    if target == 'add_stag':
        monkeypatch.setattr(loop.method, 'add_stag', poison_add_stag(
            loop.method.add_stag, at, k))
        return
    # the adapter is the method's from configure on: patched on its class
    from mmseg_stag.segmentation import SegmentationAdapter
    original = getattr(SegmentationAdapter, target)

    def poisoned(*args, **kwargs):
        out = original(*args, **kwargs)
        return out + float('nan') if at['batch'] == k else out

    monkeypatch.setattr(SegmentationAdapter, target, poisoned)


def poison_add_stag(add_stag, at, k):
    """``add_stag`` (every method's total loss goes through it) with a nan
    base loss at batch ``k`` (a nan ``beta_t`` for STAG alone)."""
    def poisoned(base, fwd, beta=None):
        if at['batch'] == k:
            if base is not None:
                base = base + float('nan')
            else:
                beta = float('nan')
        return add_stag(base, fwd, beta)

    return poisoned


@pytest.mark.parametrize('method,extra', [
    ('tent', {}), ('tent-stag', {}), ('eata', NO_FISHER), ('sar', {}),
    ('deyo', {}), ('cotta', COTTA), ('hybrid-tta', {}), ('bn-adapt-stag', {}),
])
def test_nan_loss_stops_before_anything_of_its_batch_is_written(
        method, extra, tiny_acdc, confident_checkpoint, tmp_path,
        monkeypatch):
    runner = make_runner(method, tiny_acdc, confident_checkpoint, tmp_path,
                         extra=dict(LONG_INTERVAL, **extra))
    nan_from_batch(monkeypatch, runner, K)
    with pytest.raises(ValueError) as err:
        runner.test()
    message = str(err.value)
    name = runner.test_loop.method.name
    assert re.match(rf'{name}: (loss|beta)\w* is nan at batch {K} \(image ',
                    message), message
    sample = runner.test_loop.dataloader.dataset[K]['data_samples']
    if isinstance(sample, list):  # CoTTA's views: the first one's
        sample = sample[0]
    assert sample.img_path in message
    # the two finished stages are written and resumable; nothing after
    with open(osp.join(tmp_path, 'continual_results.partial.jsonl')) as f:
        assert len(f.readlines()) == 2
    state = torch.load(osp.join(tmp_path, STATE_FILE), weights_only=True)
    assert state['batches_done'] == 4 <= K - 1
    for value in state['method']['model'].values():
        assert torch.isfinite(value.float()).all()
    assert not osp.exists(osp.join(tmp_path, 'continual_results.json'))


def test_hybrid_tta_switch_stops_on_its_own_read(tiny_acdc,
                                                 confident_checkpoint,
                                                 tmp_path, monkeypatch):
    """Hybrid-TTA reads its cross-entropy every step (the switch): a nan
    there stops at once, the threshold untouched."""
    runner = make_runner('hybrid-tta', tiny_acdc, confident_checkpoint,
                         tmp_path, extra=LONG_INTERVAL)
    nan_from_batch(monkeypatch, runner, K,
                   target='cross_entropy_at_original_size')
    with pytest.raises(ValueError, match=f'HybridTTA: loss_seg is nan at '
                       f'batch {K} \\(image '):
        runner.test()
    switch = runner.test_loop.method.switch
    assert len(switch.losses) == K and all(
        torch.isfinite(torch.tensor(switch.losses)))
    assert torch.isfinite(torch.tensor(switch.threshold))


def test_tuning_switch_refuses_a_non_finite_loss():
    switch = TuningSwitch(window=2, momentum=0.5, threshold=1.0)
    switch.decide(2.0)
    for bad in (float('nan'), float('inf')):
        with pytest.raises(ValueError, match='loss_seg is'):
            switch.decide(bad)
    assert switch.threshold == 1.5 and switch.losses == [2.0]


def test_hybrid_tta_restarts_from_the_source_with_its_modules(
        tiny_acdc, confident_checkpoint, tmp_path, monkeypatch):
    """A stage from the source restores the checkpoint's weights and the
    modules Hybrid-TTA added at their initialisation (a strict load of
    the state captured after they were added), without adding them twice.
    """
    from dataclasses import replace

    from mmseg_stag.engine import OnlineAdaptationLoop
    from mmseg_stag.engine.online_loop import runner_model
    from mmseg_stag.segmentation import ACDCContinualDataset
    stages = ACDCContinualDataset.stream_stages

    def third_from_source(self):
        return [replace(s, from_source=s.index == 2) for s in stages(self)]

    monkeypatch.setattr(ACDCContinualDataset, 'stream_stages',
                        third_from_source)
    restarts = []
    restart = OnlineAdaptationLoop.restart_from_source

    def checked(self, index):
        restart(self, index)
        adapted = self.task.adapted_module(runner_model(self.runner))
        state = adapted.state_dict()
        assert state.keys() == self.source_state.keys()
        restarts.append(all(torch.equal(state[k], v)
                            for k, v in self.source_state.items()))

    monkeypatch.setattr(OnlineAdaptationLoop, 'restart_from_source', checked)
    runner = make_runner('hybrid-tta', tiny_acdc, confident_checkpoint,
                         tmp_path)
    runner.test()
    assert restarts == [True]
    model = runner.model
    assert any(k.startswith('recon_neck.') for k in model.state_dict())
