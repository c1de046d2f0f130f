"""Mixed precision: autocast wraps each forward pass and nothing else.

Autocast caches its low-precision copies of the weights for the whole
region, so a forward after an in-place update inside one region reads the
old weights (EcoTTA's entropy forward after its regularisation step, SAR's
forward at ``theta + e_w``). Each method here is run in bfloat16 on the CPU
against a transcription of its authors' step whose autocast wraps only the
forwards, and the old arrangement (the whole step inside one region) is
shown to differ. float16 gets a ``GradScaler``."""
import copy
import functools
import math

import pytest
import torch
import torch.nn as nn
from reference.adaptation_testbed import make_cnn, unit_images
from reference.ecotta_reference import (build_reference, reference_adapt,
                                        set_cal_mseloss)
from reference.sar_reference import RefSAR

from mmseg_stag.classification import WideResNet
from mmseg_stag.classification.ecotta_network import attach_meta_networks
from mmseg_stag.core import TENT, Batch, HeadProbe, TaskAdapter, build_method
from mmseg_stag.core.probe import run_probe

BF16 = torch.bfloat16


def autocast_forward(fn):
    """``fn`` under bf16 autocast, its floating outputs back in float32."""
    def run(*args):
        with torch.autocast('cpu', dtype=BF16):
            out = fn(*args)
        return out.float()
    return run


def test_autocast_reuses_its_cast_of_an_updated_weight():
    """The PyTorch behaviour behind the rule (why the loop no longer wraps
    a whole step in one region)."""
    lin = nn.Linear(4, 4)
    x = torch.randn(2, 4)
    with torch.autocast('cpu', dtype=BF16):
        y1 = lin(x)
        with torch.no_grad():
            lin.weight.add_(1.0)
        y2 = lin(x)
    assert torch.equal(y1, y2)  # the update is not seen inside the region
    with torch.autocast('cpu', dtype=BF16):
        y3 = lin(x)
    assert not torch.equal(y1, y3)


def test_task_adapter_autocasts_each_forward_and_returns_float32_logits():
    model = make_cnn().float()
    adapter = TaskAdapter(HeadProbe('5'), BF16)
    probe = functools.partial(run_probe, adapter.probe,
                              autocast_dtype=adapter.autocast_dtype)
    x = unit_images(0).float()
    logits, [(features, z)] = probe(model, x)
    assert logits.dtype == z.dtype == torch.float32
    assert features.dtype == BF16  # a float32 copy would be D-sized
    assert not torch.is_autocast_enabled('cpu')
    with torch.no_grad():
        model[5].weight.add_(1.0)
    again, _ = probe(model, x)
    assert not torch.equal(logits, again)  # the update is seen


# ------------------------------------------------------------------ SAR
def sar_reference_forward(model, x):
    """The authors' forward (logits, features of the classifier) under
    autocast: a hook of its own, not the project's probe."""
    seen = {}

    def hook(module, args, output):
        seen['f'] = args[0]

    handle = model[5].register_forward_hook(hook)
    try:
        logits = autocast_forward(model)(x)
    finally:
        handle.remove()
    return logits, [(seen['f'], logits)]


def all_params(model):
    return list(model.parameters())


def run_sar(model, steps, probe=None, whole_step_autocast=False):
    method = build_method(dict(
        type='sar', trainable=dict(kind='all'), exclude_regex=None,
        recovery_threshold=0.0, entropy_margin=1.0,
        optimizer=dict(type='SGD', lr=0.05, momentum=0.9)))
    probe = probe or TaskAdapter(HeadProbe('5'), BF16)
    method.configure(model, probe)
    for step in range(steps):
        batch = Batch(unit_images(10 + step).float())
        with torch.enable_grad():
            if whole_step_autocast:  # the loop before this fix
                with torch.autocast('cpu', dtype=BF16):
                    method.adapt(batch)
            else:
                method.adapt(batch)
    return model


def test_sar_all_parameters_bf16_matches_forward_only_autocast():
    """SAR adapting every parameter (convolution and linear weights, which
    autocast casts): equal to the authors' step with bf16 forwards; with
    the whole step in one region the perturbation was mostly lost."""
    source = make_cnn(scale=10.0).float()
    ref = RefSAR(source, sar_reference_forward, all_params,
                 lambda m: m[5], lr=0.05, reset_constant=0.0)
    for step in range(4):
        ref.step(unit_images(10 + step).float(), 1.0 * math.log(10))
    ours = run_sar(copy.deepcopy(source), 4)
    old = run_sar(copy.deepcopy(source), 4,
                  probe=TaskAdapter(HeadProbe('5')), whole_step_autocast=True)
    gap = max((a - b).abs().max().item() for a, b in zip(
        ours.parameters(), ref.model.parameters()))
    old_gap = max((a - b).abs().max().item() for a, b in zip(
        old.parameters(), ref.model.parameters()))
    assert gap < 1e-5, gap
    assert old_gap > 100 * max(gap, 1e-7), (old_gap, gap)


# --------------------------------------------------------------- EcoTTA
PARTS, SIZE, BLOCKS = [1, 1, 2, 2], (3, 16, 16), r'block\d\.layer\.\d+'


def ecotta_pair():
    torch.manual_seed(0)
    ours = WideResNet(depth=16, widen_factor=1, num_classes=10)
    with torch.no_grad():
        ours.fc.weight.mul_(30.0)
    source = copy.deepcopy(ours)
    meta = attach_meta_networks(ours, BLOCKS, PARTS, SIZE)
    ref = build_reference(source, PARTS, SIZE)
    for k, part in enumerate(meta.parts):
        ref.meta_parts[k].load_state_dict(part.state_dict())
    return ours.train(), ref.train()


def run_ecotta(model, steps, probe, whole_step_autocast=False):
    method = build_method(dict(
        type='ecotta', reg_weight=0.5,
        optimizer=dict(type='SGD', lr=0.05, momentum=0.9)))
    method.configure(model, probe)
    for step in range(steps):
        batch = Batch(
            torch.rand(8, *SIZE, generator=torch.Generator().manual_seed(
                20 + step)))
        with torch.enable_grad():
            if whole_step_autocast:
                with torch.autocast('cpu', dtype=BF16):
                    method.adapt(batch)
            else:
                method.adapt(batch)
    return model


def meta_gap(ours, ref):
    """Largest relative difference of the meta networks' parameters,
    matched by name."""
    a = {k[len('ecotta.parts.'):]: v for k, v in ours.named_parameters()
         if k.startswith('ecotta.')}
    b = {f'{k}.{n}': v for k, meta in enumerate(ref.meta_parts)
         for n, v in meta.named_parameters()}
    assert a.keys() == b.keys()
    return max(((a[k] - b[k]).norm() / b[k].norm()).item() for k in a)


def ref_step_parts(ref, x, opt):
    """The community step's regularisation step, then its entropy
    forward (reference_adapt's first half and its second forward)."""
    opt.zero_grad()
    set_cal_mseloss(ref, True)
    ref(x)
    for encoder in ref.encoders:
        (encoder.btsloss * 0.5).backward()
    opt.step()
    opt.zero_grad()
    set_cal_mseloss(ref, False)
    return ref(x)


def test_ecotta_entropy_forward_reads_the_regularised_weights_in_bf16():
    """EcoTTA's entropy forward must read the meta convolutions after the
    regularisation step: bit-equal to the community step with bf16
    forwards; inside one region (the old loop) it read the old ones."""
    x = torch.rand(8, *SIZE, generator=torch.Generator().manual_seed(20))
    ours, ref = ecotta_pair()
    old = copy.deepcopy(ours)
    ref.forward = autocast_forward(ref.forward)
    ref_out = ref_step_parts(ref, x, torch.optim.SGD(
        [p for p in ref.parameters() if p.requires_grad], lr=0.05,
        momentum=0.9))
    outputs = {}
    for name, model, probe in (
            ('new', ours, TaskAdapter(HeadProbe('fc'), BF16)),
            ('old', old, TaskAdapter(HeadProbe('fc')))):
        method = build_method(dict(
            type='ecotta', reg_weight=0.5,
            optimizer=dict(type='SGD', lr=0.05, momentum=0.9)))
        method.configure(model, probe)
        with torch.enable_grad(), torch.autocast(
                'cpu', dtype=BF16, enabled=name == 'old'):
            method.regularisation_step(Batch(x))
            outputs[name] = run_probe(probe.probe, model, x, None,
                                      probe.autocast_dtype)[0].float()
    assert meta_gap(ours, ref) == 0 == meta_gap(old, ref)
    assert torch.equal(outputs['new'], ref_out)
    assert (outputs['old'] - ref_out).abs().max() > 1e-2


def test_ecotta_bf16_steps_match_forward_only_autocast():
    """Whole steps: close to the community step with bf16 forwards (the
    two entropy formulas' float32 roundings enter the bf16 backward), far
    from the old single region."""
    ours, ref = ecotta_pair()
    old = copy.deepcopy(ours)
    ref.forward = autocast_forward(ref.forward)
    ref_opt = torch.optim.SGD([p for p in ref.parameters()
                               if p.requires_grad], lr=0.05, momentum=0.9)
    x = torch.rand(8, *SIZE, generator=torch.Generator().manual_seed(20))
    reference_adapt(ref, ref_opt, x, 0.5, 0.4 * math.log(10))
    run_ecotta(ours, 1, TaskAdapter(HeadProbe('fc'), BF16))
    run_ecotta(old, 1, TaskAdapter(HeadProbe('fc')),
               whole_step_autocast=True)
    gap, old_gap = meta_gap(ours, ref), meta_gap(old, ref)
    assert gap < 0.05 and old_gap > 0.2 and old_gap > 10 * gap, \
        (gap, old_gap)


# ------------------------------------------------------------------ fp16
class Wide(nn.Module):
    """Per-pixel logits over many pixels (a mean loss gives each pixel a
    share of ~1/M of its gradient: TENT's full-size CE ~1/2M)."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 1)
        self.norm = nn.GroupNorm(2, 8)
        self.head = nn.Conv2d(8, 4, 1)

    def forward(self, x):
        return self.head(self.norm(self.conv(x)))


class SmallLossTENT(TENT):
    """TENT with its loss scaled down, so that every pixel's gradient is
    below float16's smallest subnormal (6e-8) whatever the predictions."""

    def base_loss(self, batch, fwd):
        return super().base_loss(batch, fwd) * 1e-3


def tent_update(scaler: bool, dtype):
    torch.manual_seed(0)
    model = Wide().eval()
    method = SmallLossTENT(trainable=dict(kind='all'),
                           optimizer=dict(type='SGD', lr=1e3))
    method.configure(model, TaskAdapter(HeadProbe(
        'head', prediction_kind='per_pixel'), dtype))
    if scaler:
        method.use_grad_scaler('cpu')
    before = model.conv.weight.detach().clone()
    x = torch.randn(1, 3, 512, 1024,
                    generator=torch.Generator().manual_seed(1))
    with torch.enable_grad():
        method.adapt(Batch(x))
    return model.conv.weight.detach() - before


def test_fp16_updates_need_the_grad_scaler():
    """float16: without the scaler the first convolution's gradient is
    almost all zero (underflow); with it the update equals float32's."""
    exact = tent_update(False, None)
    plain = tent_update(False, torch.float16)
    scaled = tent_update(True, torch.float16)
    assert exact.abs().min() > 0
    assert (plain == 0).float().mean() > 0.5  # lost without the scaler
    torch.testing.assert_close(scaled, exact, rtol=0.05, atol=1e-7)


def test_sar_refuses_the_grad_scaler():
    with pytest.raises(ValueError, match='SAR cannot scale its gradients'):
        build_method(dict(type='sar')).use_grad_scaler('cpu')
