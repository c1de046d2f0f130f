"""The ACDC configs against CoTTA's ACDC code (``tests/reference/
cotta_acdc_reference.py``), in float64 on a generated ACDC-layout stream of
two rounds: the same adapted parameters after every stage and the same
per-stage mIoU."""
import itertools
import json
import os.path as osp

import pytest
import torch
from mmengine.hooks import Hook

from reference.cotta_acdc_reference import (single_gpu_tent, stage_miou,
                                            tent_params)
from seg_helpers import SEG_CFG, fresh_model, make_runner


class StageEnds(Hook):
    """The adapted parameters after the last batch of every stage."""

    def __init__(self, model):
        self.model, self.params = model, {}

    def after_test_iter(self, runner, batch_idx, data_batch=None,
                        outputs=None):
        stage = data_batch['data_samples'][0].metainfo['stage']
        self.params[stage] = {n: p.detach().clone()
                              for n, p in self.model.named_parameters()
                              if p.requires_grad}


def run_ours(method, tiny_acdc, checkpoint, work_dir, extra=None):
    """Our loop on two rounds in float64: ``(runner, params after each
    stage, per-stage mIoU)``."""
    runner = make_runner(method, tiny_acdc, checkpoint, work_dir, rounds=2,
                         extra=extra)
    runner.model.double()
    ends = StageEnds(runner.model)
    runner.register_hook(ends)
    runner.test()
    with open(osp.join(str(work_dir), 'continual_results.json')) as f:
        stages = json.load(f)['stages']
    return runner, ends.params, [s['mIoU'] for s in stages]


def stream_by_stage(runner):
    """The runner's test batches, grouped by stage (CoTTA: one data loader
    per condition and round)."""
    def stage(batch):
        return batch['data_samples'][0].metainfo['stage']
    return [(s, list(b)) for s, b in
            itertools.groupby(runner.test_dataloader, key=stage)]


def test_tent_config_is_cottas_single_gpu_tent(tiny_acdc, tiny_checkpoint,
                                               tmp_path):
    runner, ours, ours_miou = run_ours('tent', tiny_acdc, tiny_checkpoint,
                                       tmp_path)
    assert set(ours[0]) == {n for n, p in runner.model.named_parameters()
                            if any(p is q for q in tent_params(runner.model))}
    model, _ = fresh_model(SEG_CFG, 'tent', tiny_acdc, tiny_checkpoint,
                           'cpu')
    model.double()
    stages = stream_by_stage(runner)
    assert [s for s, _ in stages] == list(range(8))  # 2 rounds x 4
    for stage, batches in stages:
        results = single_gpu_tent(model, batches)
        theirs = dict(model.named_parameters())
        for name, value in ours[stage].items():
            torch.testing.assert_close(value, theirs[name], rtol=0,
                                       atol=1e-12, msg=f'{stage} {name}')
        assert ours_miou[stage] == pytest.approx(stage_miou(results),
                                                 abs=1e-9)
    # the adaptation did move the parameters, stage after stage
    assert not torch.equal(ours[0]['backbone.layers.0.2.weight'],
                           ours[7]['backbone.layers.0.2.weight'])


def test_one_adam_for_the_whole_stream_is_not_cottas(tiny_acdc,
                                                     tiny_checkpoint,
                                                     tmp_path):
    """Without the per-stage optimizer the second stage already differs
    (the reference above would catch a loop that ignores the option)."""
    _, ours, _ = run_ours(
        'tent', tiny_acdc, tiny_checkpoint, tmp_path,
        extra={'test_cfg.method.reset_optimizer_per_stage': False})
    _, reset, _ = run_ours('tent', tiny_acdc, tiny_checkpoint,
                           tmp_path / 'reset')
    name = 'backbone.layers.0.2.weight'
    assert torch.equal(ours[0][name], reset[0][name])
    assert not torch.allclose(ours[1][name], reset[1][name], rtol=0,
                              atol=1e-12)
