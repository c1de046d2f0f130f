"""Hybrid-TTA against a float64 transcription of its authors' code
(``tests/reference/hybrid_tta_reference.py``): our config through the
online loop and their ``single_gpu_our``, image by image over a stream of
eight images in four stages: the same masks, losses, switch decisions and
every parameter of the student and the teacher after each image."""
import copy
import re

import numpy as np
import pytest
import torch
from mmengine.hooks import Hook
from reference.hybrid_tta_reference import (FreezeController, HybridSegmentor,
                                            MaskGenerator, recon_loss,
                                            single_gpu_our)
from seg_helpers import SEG_CFG, fresh_model, make_runner

from mmseg_stag.segmentation.methods.hybrid_tta import TuningSwitch
from mmseg_stag.segmentation.models.hybrid_tta_modules import (
    ParallelAdapter, PatchMaskGenerator, masked_l1, masked_mit_features)

#: the tiny stream: 64x32 inputs, so 8-px mask patches; a small neck; a
#: switch that tunes both ways within eight images
OPTIONS = {
    'test_cfg.method.mask_patch_size': 8,
    'test_cfg.method.neck_embed_dim': 16,
    'test_cfg.method.switch': dict(window=2, margin=-0.05, momentum=0.0,
                                   threshold=0.0),
}


def ref_name(name):
    """Our parameter's name in the transcription."""
    m = re.match(r'backbone\.layers\.(\d+)\.1\.(\d+)\.ffn\.adapter\.'
                 r'(down|up|scale)(.*)', name)
    if m:
        i, j, part, rest = m.groups()
        layer = dict(down='layer.0', up='layer.2', scale='layer.3.scale')
        return f'adapters.{i}.{j}.{layer[part]}{rest}'
    if name == 'backbone.mask_token_embed.mask_token':
        return 'mask_token'
    return name if name.startswith('recon_neck.') else 'seg.' + name


class Recorded:
    """A mask generator that keeps what it draws."""

    def __init__(self, masks, drawn):
        self.masks, self.drawn = masks, drawn

    def __call__(self, size):
        self.drawn.append(self.masks(size))
        return self.drawn[-1]

    def __getattr__(self, name):
        return getattr(self.masks, name)


class Record(Hook):
    """Our side, image by image: the masks drawn, the switch, the student's
    and the teacher's parameters; the state before the first image."""

    def __init__(self):
        self.start, self.images, self.masks = None, [], []

    def before_test_iter(self, runner, batch_idx, data_batch=None):
        method = runner.test_loop.method
        if batch_idx == 0:
            self.start = {k: v.clone()
                          for k, v in runner.model.state_dict().items()}
            method.masks = Recorded(method.masks, self.masks)

    def after_test_iter(self, runner, batch_idx, data_batch=None,
                        outputs=None):
        method = runner.test_loop.method
        self.images.append(dict(
            loss_seg=method.switch.losses[-1],
            efficient=method.switch.efficient,
            student={n: p.detach().clone()
                     for n, p in runner.model.named_parameters()},
            teacher={n: p.detach().clone()
                     for n, p in method.teacher.named_parameters()}))


def test_hybrid_tta_is_single_gpu_our(tiny_acdc, tiny_checkpoint, tmp_path):
    runner = make_runner('hybrid-tta', tiny_acdc, tiny_checkpoint, tmp_path,
                         extra=OPTIONS)
    runner.model.double()
    record = Record()
    runner.register_hook(record)
    runner.test()
    assert len(record.images) == 8  # 4 conditions x 2 images

    seg, _ = fresh_model(SEG_CFG, 'hybrid-tta', tiny_acdc, tiny_checkpoint,
                         'cpu', extra=OPTIONS)
    model = HybridSegmentor(seg, hidden_dim=5, neck_dim=16).double()
    state = {ref_name(k): v for k, v in record.start.items()}
    assert set(state) == set(model.state_dict())
    model.load_state_dict(state)
    ema_model = copy.deepcopy(model)
    np.random.seed(42)  # scripts/ours.py
    masks = MaskGenerator((32, 64), mask_patch_size=8, model_patch_size=4)
    switch = FreezeController(threshold=0.0, loss_seg_alpha=0.0,
                              window_size=2, perc=-0.05)

    seen = []

    def compare(log):
        ours = record.images[len(seen)]
        torch.testing.assert_close(record.masks[len(seen)], log['mask'],
                                   rtol=0, atol=0)
        assert ours['loss_seg'] == pytest.approx(
            log['log_vars']['decode.loss_seg'], abs=1e-12)
        assert ours['efficient'] == log['frozen']
        for side, theirs in (('student', model), ('teacher', ema_model)):
            params = dict(theirs.named_parameters())
            for name, value in ours[side].items():
                torch.testing.assert_close(
                    value, params[ref_name(name)], rtol=0, atol=1e-12,
                    msg=f'image {len(seen)} {side} {name}')
        seen.append(log['frozen'])

    from segmentation.engine.test_acdc_protocol import stream_by_stage
    for _, batches in stream_by_stage(runner):
        single_gpu_our(model, ema_model, batches, switch, masks,
                       lr=7.5e-5, on_image=compare)
    assert len(seen) == 8
    assert True in seen and False in seen  # both tuning modes ran
    # the adaptation moved the blocks and the adapters
    name = 'backbone.layers.0.1.0.ffn.adapter.up.weight'
    assert not torch.equal(record.start[name],
                           record.images[-1]['student'][name])


def test_the_student_runs_masked_without_hooks(tiny_acdc, tiny_checkpoint,
                                              tmp_path):
    """The student's levels come from ``masked_mit_features``: MMSeg's MiT
    forward itself where nothing is masked, the mask token where it is; no
    module of the student or the teacher has a forward hook (the head
    probe's lives for one forward); a slide-inference config is refused
    before the stream."""
    runner = make_runner('hybrid-tta', tiny_acdc, tiny_checkpoint, tmp_path,
                         extra=OPTIONS)
    runner.test()
    method = runner.test_loop.method
    for model in (method.model, method.teacher):
        assert not [n for n, m in model.named_modules()
                    if m._forward_hooks or m._forward_pre_hooks]
    backbone = method.model.backbone
    x = torch.randn(1, 3, 32, 64)
    with torch.no_grad():
        backbone.mask_token_embed.mask_token.normal_()
        unmasked = masked_mit_features(backbone, x,
                                       torch.zeros(1, 8, 16, dtype=torch.long))
        plain = backbone(x)
        mask = torch.zeros(1, 8, 16, dtype=torch.long)
        mask[0, :, :8] = 1  # the left half of the tokens
        masked = masked_mit_features(backbone, x, mask)
        tokens, hw = backbone.layers[0][0](x)
    for a, b in zip(unmasked, plain):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    # the first stage's input: its right half unchanged, the left the token
    embed = backbone.mask_token_embed(tokens, mask).reshape(1, *hw, -1)
    torch.testing.assert_close(embed[0, :, 8:],
                               tokens.reshape(1, *hw, -1)[0, :, 8:])
    assert torch.equal(embed[0, :, :8],
                       backbone.mask_token_embed.mask_token[0].expand(8, 8,
                                                                      -1))
    assert not torch.equal(masked[0], unmasked[0])
    slide = dict(OPTIONS, **{'model.test_cfg': dict(
        mode='slide', crop_size=(32, 32), stride=(24, 24))})
    runner = make_runner('hybrid-tta', tiny_acdc, tiny_checkpoint,
                         tmp_path / 'slide', extra=slide)
    with pytest.raises(ValueError, match="test_cfg.mode='slide' is not"):
        runner.test()


def test_mask_generator_is_theirs_draw_for_draw():
    np.random.seed(42)
    theirs = MaskGenerator((544, 960))
    ours = PatchMaskGenerator(seed=42)
    for _ in range(3):
        mask = ours((544, 960))
        assert mask.shape == (1, 136, 240) and mask.dtype == torch.int64
        torch.testing.assert_close(mask, theirs(), rtol=0, atol=0)
    assert int(mask[0, ::8, ::8].sum()) == 306  # ceil(0.6 x 17 x 30)
    with pytest.raises(ValueError, match='960x540 must be a multiple'):
        ours((960, 540)[::-1])


def test_masked_l1_is_pixel_reconstruction_loss():
    gen = torch.Generator().manual_seed(0)
    rec, img = (torch.randn(1, 3, 16, 24, generator=gen, dtype=torch.float64)
                for _ in range(2))
    mask = (torch.rand(1, 4, 6, generator=gen) > 0.5).long()
    torch.testing.assert_close(masked_l1(rec, img, mask),
                               recon_loss(rec, img, mask), rtol=0, atol=0)
    # the mean |rec - img| over the masked pixels and channels
    pixels = mask.repeat_interleave(4, 1).repeat_interleave(4, 2).bool()
    expected = (rec - img).abs().permute(0, 2, 3, 1)[pixels].mean()
    torch.testing.assert_close(masked_l1(rec, img, mask), expected)


def test_adapter_inits():
    torch.manual_seed(0)
    backbone_init = ParallelAdapter(64)
    # the authors' quirk: normal(0, 0.02) weights (truncated at +-2, i.e.
    # not at all) where their reset_parameters zeroes the up projection
    for linear in (backbone_init.down, backbone_init.up):
        assert 0.015 < float(linear.weight.std()) < 0.025
        assert torch.equal(linear.bias, torch.zeros_like(linear.bias))
    assert float(backbone_init.scale) == 1.0
    zero = ParallelAdapter(64, init='zero_up')
    x = torch.randn(2, 7, 64)
    assert torch.equal(zero(x), torch.zeros_like(x))
    with pytest.raises(ValueError, match='adapter_init'):
        ParallelAdapter(64, init='kaiming')


def test_switch_window_threshold_and_state():
    switch = TuningSwitch(window=3, margin=0.1, momentum=0.5, threshold=4.0)
    theirs = FreezeController(threshold=4.0, loss_seg_alpha=0.5,
                              window_size=3, perc=0.1)

    class Frozen(torch.nn.Module):
        pass

    for loss in (3.0, 2.0, 1.0, 0.5, 4.0, 6.0, 1.0):
        ours = switch.decide(loss)
        theirs(Frozen(), (None, {'decode.loss_seg': loss}))
        assert ours == theirs.frozen_flag
        assert switch.threshold == theirs.threshold
    again = TuningSwitch(window=3)
    again.load_state_dict(switch.state_dict())
    assert again.decide(2.0) == switch.decide(2.0)
    with pytest.raises(ValueError, match='window'):
        TuningSwitch(window=0)
