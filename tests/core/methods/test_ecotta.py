"""EcoTTA against an independent transcription of its public code
(``tests/reference/ecotta_reference.py``: the authors' notebook and the
community ``main.py`` step) on a tiny WideResNet in float64."""
import copy
import math

import pytest
import torch
import torch.nn as nn
from reference.adaptation_testbed import SEG_ADAPTER
from reference.ecotta_reference import (build_reference, reference_adapt,
                                        set_cal_mseloss)

from mmseg_stag.classification import CLS_MODELS, WideResNet
from mmseg_stag.classification.ecotta_network import attach_meta_networks
from mmseg_stag.core import (Batch, EcoTTA, HeadProbe, STAGLoss, TaskAdapter,
                             build_method)

PARTS = [1, 1, 2, 2]  # WRN-16-1: 6 blocks, K = 4
SIZE = (3, 16, 16)
BLOCKS = r'block\d\.layer\.\d+'
LAMBDA, LR = 0.5, 0.05
PROBE = HeadProbe('fc')
ADAPTER = TaskAdapter(PROBE)


def make_wrn(seed=0):
    """WRN-16-1 (10 classes), float64, a confident classifier (the
    ``0.4 ln C`` filter keeps part of a batch)."""
    torch.manual_seed(seed)
    model = WideResNet(depth=16, widen_factor=1, num_classes=10).double()
    with torch.no_grad():
        model.fc.weight.mul_(30.0)
    return model


def randomise_meta(meta, seed=3):
    """Non-trivial meta networks (their BNs are not the identity)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in meta.named_parameters():
            p.copy_(torch.rand(p.shape, generator=g, dtype=p.dtype) * 0.5 +
                    (0.75 if name.endswith('bn.weight') else -0.25))


def pair(seed=0, parts=PARTS):
    """Ours (meta networks joined into a WRN) and the transcription (the
    notebook's network on a copy of the same WRN), with equal meta-network
    weights."""
    ours = make_wrn(seed)
    source = copy.deepcopy(ours)
    meta = attach_meta_networks(ours, BLOCKS, parts, SIZE)
    meta.double()
    randomise_meta(meta)
    ref = build_reference(source, parts, SIZE).double()
    for k, part in enumerate(meta.parts):
        ref.meta_parts[k].load_state_dict(part.state_dict())
    return ours.train(), ref.train()


def images(seed, n=8):
    return torch.rand(n, *SIZE, dtype=torch.float64,
                      generator=torch.Generator().manual_seed(seed))


def meta_state(ours):
    return {k[len('ecotta.parts.'):]: v
            for k, v in ours.state_dict().items() if k.startswith('ecotta.')}


def ref_meta_state(ref):
    out = {}
    for k, meta in enumerate(ref.meta_parts):
        for name, v in meta.state_dict().items():
            out[f'{k}.{name}'] = v
    return out


def assert_same_state(ours, ref):
    a, b = meta_state(ours), ref_meta_state(ref)
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-10, atol=1e-12,
                                   msg=k)


def test_outputs_regulariser_and_gradients_match_the_notebook():
    ours, ref = pair()
    x = images(1)
    torch.testing.assert_close(ours(x), ref(x), rtol=1e-10, atol=1e-12)
    # regularised forward: R_k per part, and the gradients of lambda*sum R_k
    with ours.ecotta.regularising():
        out = ours(x)
        reg = [p.reg_loss for p in ours.ecotta.parts]
        (LAMBDA * ours.ecotta.regulariser()).backward()
    set_cal_mseloss(ref, True)
    ref_out = ref(x)
    for encoder in ref.encoders:
        (encoder.btsloss * LAMBDA).backward()
    torch.testing.assert_close(out, ref_out, rtol=1e-10, atol=1e-12)
    for k, encoder in enumerate(ref.encoders):
        torch.testing.assert_close(reg[k], encoder.btsloss, rtol=1e-10,
                                   atol=1e-12)
    for k, part in enumerate(ours.ecotta.parts):
        for (name, p), q in zip(part.named_parameters(),
                                ref.meta_parts[k].parameters()):
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-9,
                                       atol=1e-12, msg=f'{k}.{name}')
    # outside the context nothing is detached or kept
    assert all(p.reg_loss is None and not p.regularising
               for p in ours.ecotta.parts)


def test_regulariser_trains_only_its_own_meta_network():
    """R_k's input is detached: meta network j < k gets no gradient from
    R_k (here: from the last part's R_K alone)."""
    ours, _ = pair()
    with ours.ecotta.regularising():
        ours(images(1))
        ours.ecotta.parts[-1].reg_loss.backward()
    for part in ours.ecotta.parts[:-1]:
        assert all(p.grad is None for p in part.parameters())
    assert all(p.grad is not None for p in ours.ecotta.parts[-1].parameters())


def build(ours, **kwargs):
    kwargs.setdefault('optimizer', dict(type='SGD', lr=LR, momentum=0.9))
    method = EcoTTA(reg_weight=LAMBDA, **kwargs)
    method.configure(ours, ADAPTER)
    return method


@pytest.mark.parametrize('margin', [0.4, 0.0])
def test_steps_match_the_community_adapt_over_batches(margin):
    """Several batches: the prediction (the second forward's) and every
    meta parameter and BN statistic equal the transcription's after each
    batch; the frozen network's parameters never change. ``margin=0``: no
    sample is reliable, the authors' empty mean still steps (momentum)."""
    ours, ref = pair()
    frozen = {k: v.clone() for k, v in ours.named_parameters()
              if not k.startswith('ecotta.')}
    method = build(ours, entropy_margin=margin)
    assert {n for n, _ in method.params} == {
        n for n, _ in ours.named_parameters() if n.startswith('ecotta.')}
    ref_opt = torch.optim.SGD(
        [p for p in ref.parameters() if p.requires_grad], lr=LR,
        momentum=0.9)
    kept = 0
    for step in range(4):
        x = images(10 + step)
        with torch.enable_grad():
            prediction, stats = method.adapt(Batch(x))
        ref_out = reference_adapt(ref, ref_opt, x, LAMBDA,
                                  margin * math.log(10))
        torch.testing.assert_close(prediction.value, ref_out.detach(),
                                   rtol=1e-9,
                                   atol=1e-10)
        assert_same_state(ours, ref)
        kept += stats['num_reliable']
    assert (kept > 0) == (margin > 0)
    assert method.t == 4
    for k, v in ours.named_parameters():
        if not k.startswith('ecotta.'):
            assert torch.equal(v, frozen[k]), k


def test_stag_adds_beta_times_stag_loss_to_the_entropy_step():
    ours, ref = pair()
    stag = dict(beta0=2.0, gamma=3.0)
    method = build(ours, stag=stag)
    ref_opt = torch.optim.SGD(
        [p for p in ref.parameters() if p.requires_grad], lr=LR,
        momentum=0.9)
    loss_fn = STAGLoss()
    features = {}
    ref.classifier.fc.register_forward_hook(
        lambda m, a, o: features.__setitem__('f', a[0]))
    fc = ref.classifier.fc
    for step in range(3):
        x = images(20 + step)
        with torch.enable_grad():
            _, stats = method.adapt(Batch(x))
        beta = stag['beta0'] * math.exp(-step / stag['gamma'])
        assert stats['beta'] == pytest.approx(beta)
        reference_adapt(
            ref, ref_opt, x, LAMBDA, 0.4 * math.log(10),
            extra=lambda out: beta * loss_fn(features['f'], out, fc.weight,
                                             fc.bias))
        assert_same_state(ours, ref)


def test_network_builder_presets_and_bad_partitions():
    net = CLS_MODELS.build(dict(
        type='EcoTTANetwork', network=dict(type='WRN40_2_AugMix'), K=5))
    assert net.ecotta.blocks_per_part == (3, 3, 3, 3, 6)
    shapes = [(p.conv_block.conv.in_channels, p.conv_block.conv.out_channels,
               p.conv_block.conv.stride[0]) for p in net.ecotta.parts]
    # the notebook's in_out_depth_s / in_out_hight_s for K=5
    assert shapes == [(16, 32, 1), (32, 32, 1), (32, 64, 2), (64, 64, 1),
                      (64, 128, 2)]
    wrn28 = CLS_MODELS.build(dict(
        type='EcoTTANetwork', network=dict(type='WRN28_10_Standard'), K=4))
    assert wrn28.ecotta.blocks_per_part == (2, 2, 4, 4)
    with pytest.raises(ValueError, match=r'cover the 18 blocks.*cover 17'):
        CLS_MODELS.build(dict(type='EcoTTANetwork',
                              network=dict(type='WRN40_2_AugMix'),
                              parts=[3, 3, 5, 6]))
    with pytest.raises(ValueError, match='no K=3 preset for WRN40_2_AugMix'):
        CLS_MODELS.build(dict(type='EcoTTANetwork',
                              network=dict(type='WRN40_2_AugMix'), K=3))
    with pytest.raises(ValueError, match="no preset for network type "
                       "'SmallViT'"):
        CLS_MODELS.build(dict(type='EcoTTANetwork',
                              network=dict(type='SmallViT'), K=4))
    with pytest.raises(ValueError, match='must follow each other'):
        # a block's sub-layers: bn1's output is not conv1's input
        attach_meta_networks(make_wrn(), r'block1\.layer\.0\.(bn1|bn2)',
                             [2], SIZE)


def test_meta_networks_are_modules_in_place_and_keys_unchanged():
    """No hook: each part's entry and exit are items of the blocks'
    ``nn.Sequential`` (``print`` shows them); the network's keys are the
    source's plus ``ecotta.*``, so checkpoints load as before; a block
    outside an ``nn.Sequential`` is refused before anything changes."""
    source = make_wrn()
    net = copy.deepcopy(source)
    attach_meta_networks(net, BLOCKS, PARTS, SIZE)
    assert not any(m._forward_hooks or m._forward_pre_hooks
                   for m in net.modules())
    assert set(net.state_dict()) == set(source.state_dict()) | {
        k for k in net.state_dict() if k.startswith('ecotta.parts.')}
    layer = net.block1.layer
    # PARTS [1, 1, 2, 2]: block1's two blocks are a part each
    assert list(layer._modules) == ['ecotta_in0', '0', 'ecotta_out0',
                                    'ecotta_in1', '1', 'ecotta_out1']
    assert list(net.block3.layer._modules) == ['ecotta_in3', '0', '1',
                                               'ecotta_out3']
    text = repr(net)
    for k in range(len(PARTS)):
        assert f'(ecotta_in{k}): MetaEntry(ecotta.parts.{k}' in text
        assert f'(ecotta_out{k}): MetaExit(ecotta.parts.{k}' in text
        assert net.get_submodule(
            [n for n, _ in net.named_modules()
             if n.endswith(f'ecotta_in{k}')][0]).part is net.ecotta.parts[k]
    # the source weights load into the network with meta networks
    net.load_state_dict(source.state_dict(), strict=False)
    # a copy (a teacher) keeps one owner per part
    twin = copy.deepcopy(net)
    assert twin.block1.layer.ecotta_in0.part is twin.ecotta.parts[0]

    class Wrapped(nn.Module):  # the blocks' parent is no nn.Sequential
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Conv2d(3, 4, 1), nn.Conv2d(4, 4, 1)
            self.fc = nn.Linear(4, 10)

        def forward(self, x):
            return self.fc(self.b(self.a(x)).mean((2, 3)))

    plain = Wrapped()
    with pytest.raises(ValueError, match=r"parent of block 'a' is a "
                       r'Wrapped .*nn.Sequential'):
        attach_meta_networks(plain, r'a|b', [1, 1], SIZE)
    assert not hasattr(plain, 'ecotta') and list(plain._modules) == [
        'a', 'b', 'fc']


def test_registry_and_a_network_without_meta_networks():
    assert isinstance(build_method(dict(type='ecotta')), EcoTTA)
    with pytest.raises(ValueError, match='EcoTTANetwork'):
        EcoTTA().configure(make_wrn(), ADAPTER)
    with pytest.raises(ValueError, match='per_sample outputs only'):
        EcoTTA().check_supports(SEG_ADAPTER)
