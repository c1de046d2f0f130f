"""The ACDC configs against CoTTA's ACDC code (``tests/reference/
cotta_acdc_reference.py``), in float64 on a generated ACDC-layout stream of
two rounds: the same adapted parameters after every stage and the same
per-stage mIoU."""
import copy
import itertools
import json
import os.path as osp

import pytest
import torch
from mmengine.hooks import Hook
from reference.cotta_acdc_reference import (label_miou, single_gpu_cotta,
                                            single_gpu_tent, stage_miou,
                                            tent_params)
from seg_helpers import SEG_CFG, fresh_model, make_runner

from mmseg_stag.segmentation.online_task import split_views


def stage_of(runner, batch_idx):
    """The stage of a batch, as the loop's schedule has it."""
    return runner.test_loop.schedule[batch_idx].stage.index


class StageEnds(Hook):
    """The adapted parameters after the last batch of every stage."""

    def __init__(self, model):
        self.model, self.params = model, {}

    def after_test_iter(self, runner, batch_idx, data_batch=None,
                        outputs=None):
        self.params[stage_of(runner, batch_idx)] = {n: p.detach().clone()
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
    return runner, ends.params, [s['score'] for s in stages]


def stream_by_stage(runner):
    """The runner's test batches, grouped by stage (CoTTA: one data loader
    per condition and round)."""
    batches = enumerate(runner.test_dataloader)
    return [(s, [b for _, b in group]) for s, group in itertools.groupby(
        batches, key=lambda ib: stage_of(runner, ib[0]))]


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
        extra={'test_cfg.method.stage_restart': ()})
    _, fresh, _ = run_ours('tent', tiny_acdc, tiny_checkpoint,
                           tmp_path / 'fresh')
    name = 'backbone.layers.0.2.weight'
    assert torch.equal(ours[0][name], fresh[0][name])
    assert not torch.allclose(ours[1][name], fresh[1][name], rtol=0,
                              atol=1e-12)


class SeedAtFirstBatch(Hook):
    """Seeds the global generator once the stream's iterator exists, so the
    restore masks draw the same numbers as the transcription's."""

    priority = 'HIGHEST'

    def __init__(self, seed):
        self.seed = seed

    def before_test_iter(self, runner, batch_idx, data_batch=None):
        if batch_idx == 0:
            torch.manual_seed(self.seed)


SHARPEN = 12.0
#: a small multi-view pipeline (6 views, main view 2) on the tiny stream
VIEWS = {
    'test_dataloader.dataset.pipeline.1.scale': (128, 64),
    'test_dataloader.dataset.pipeline.1.ratios': [0.5, 1.0, 1.5],
}


def test_cotta_config_is_cottas_single_gpu_cotta(tiny_acdc, tiny_checkpoint,
                                                 tmp_path):
    runner = make_runner('cotta', tiny_acdc, tiny_checkpoint, tmp_path,
                         rounds=2, extra=VIEWS)
    runner.model.double()
    sharpen(runner.model)
    ends = StageEnds(runner.model)
    runner.register_hook(ends)
    runner.register_hook(SeedAtFirstBatch(7))
    runner.test()
    assert runner.test_loop.task.main_view == 2
    # both branches of the label occur: confident and not confident pixels
    confident = runner.message_hub.log_scalars['test/confident_pixels']
    assert 0.05 < min(confident.data[0]) and max(confident.data[0]) < 0.95
    with open(osp.join(str(tmp_path), 'continual_results.json')) as f:
        ours_miou = [s['score'] for s in json.load(f)['stages']]
    method, ours = runner.test_loop.method, ends.params
    # every parameter is adapted
    assert set(ours[0]) == {n for n, _ in runner.model.named_parameters()}

    model, _ = fresh_model(SEG_CFG, 'cotta', tiny_acdc, tiny_checkpoint,
                           'cpu', extra=VIEWS)
    model.double()
    sharpen(model)
    anchor = {k: v.clone() for k, v in model.state_dict().items()}
    ema_model, anchor_model = copy.deepcopy(model), copy.deepcopy(model)
    for p in ema_model.parameters():
        p.detach_()
    stages = [(s, [split(b) for b in batches])
              for s, batches in stream_by_stage(runner)]
    torch.manual_seed(7)
    for stage, batches in stages:
        results = single_gpu_cotta(model, batches, anchor, ema_model,
                                   anchor_model, img_id=2)
        theirs = dict(model.named_parameters())
        for name, value in ours[stage].items():
            torch.testing.assert_close(value, theirs[name], rtol=0,
                                       atol=1e-12, msg=f'{stage} {name}')
        gts = [b[2]['data_samples'][0].gt_sem_seg.data for b in batches]
        assert ours_miou[stage] == pytest.approx(
            label_miou(results, gts), abs=1e-9)
    for name, value in method.teacher.named_parameters():
        torch.testing.assert_close(value, dict(
            ema_model.named_parameters())[name], rtol=0, atol=1e-12)


def sharpen(model, factor=SHARPEN):
    """Scales the tiny random classifier so that the source model's
    confidence straddles CoTTA's 0.69 threshold."""
    with torch.no_grad():
        model.decode_head.conv_seg.weight.mul_(factor)
        model.decode_head.conv_seg.bias.mul_(factor)


def split(batch):
    """A multi-view data batch as one data batch per view."""
    return split_views(batch)
