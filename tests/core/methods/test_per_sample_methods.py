"""Which classifier outputs each method takes. EATA, SAR and DeYO take
both (on per-pixel outputs every pixel is a sample,
:func:`flatten_outputs`); a method that declares per-sample outputs only
refuses a per-pixel task when it is configured, before any batch. A method
configured for one kind refuses the other on the batch."""
import copy

import pytest
import torch
import torch.nn as nn

from mmseg_stag.core import (TENT, Batch, ForwardPass, HeadProbe,
                             TaskAdapter, build_method, flatten_outputs,
                             per_sample_logits)

from reference.adaptation_testbed import (C, CNN_ADAPTER, SEG_ADAPTER, adapt,
                                          assert_state_unchanged)
from reference.adaptation_testbed import block_images as batch
from reference.adaptation_testbed import make_cnn as make_model
from reference.adaptation_testbed import make_seg_net, seg_images

PER_SAMPLE_AND_PIXEL = ('eata', 'sar', 'deyo')


def build(name):
    # ETA: no Fisher information needed before adapting
    return build_method(dict(type=name, fisher_alpha=0) if name == 'eata'
                        else dict(type=name))


class PerSampleOnly(TENT):
    """A method defined on per-sample outputs only."""
    supported_prediction_kinds = ('per_sample', )


def test_per_pixel_task_refused_at_configure():
    method = PerSampleOnly()
    method.check_supports('per_sample')
    with pytest.raises(ValueError, match='supports per_sample outputs only'):
        method.check_supports('per_pixel')
    model = make_model()
    flags = [p.requires_grad for p in model.parameters()]
    with pytest.raises(ValueError, match='supports per_sample outputs only'):
        method.configure(model, TaskAdapter(
            HeadProbe('5', prediction_kind='per_pixel')))
    # refused before anything was set up
    assert method.model is None and method.optimizer is None
    assert method.params == []
    assert [p.requires_grad for p in model.parameters()] == flags
    with pytest.raises(RuntimeError, match='configure'):
        adapt(method, batch(0))


@pytest.mark.parametrize('name', ('source', 'bn_adapt', 'tent') +
                         PER_SAMPLE_AND_PIXEL)
def test_methods_taking_both_kinds(name):
    per_pixel = nn.Sequential(nn.Conv2d(3, 4, 1), nn.BatchNorm2d(4),
                              nn.Conv2d(4, C, 1))
    for kind, model, head in (('per_sample', make_model(), 5),
                              ('per_pixel', per_pixel, 2)):
        method = build(name)
        assert method.supported_prediction_kinds == ('per_sample',
                                                     'per_pixel')
        method.check_supports(kind)
        method.configure(model, TaskAdapter(
            HeadProbe(str(head), prediction_kind=kind)))
        assert method.model is model


@pytest.mark.parametrize('name', PER_SAMPLE_AND_PIXEL)
def test_per_pixel_logits_rejected_on_the_batch(name):
    """A method configured for per-sample outputs that is given per-pixel
    head outputs raises, and leaves the model as it was."""
    model = make_model()
    method = build(name)
    method.configure(model, CNN_ADAPTER)

    def seg_forward(net, x):
        logits = net[5].weight.new_zeros(x.shape[0], C, 4, 4) + \
            net[1].weight.sum()
        feats = torch.randn(x.shape[0], 16, 4, 4, dtype=x.dtype)
        return logits, [(feats, logits)]

    before = copy.deepcopy(model.state_dict())
    with pytest.raises(ValueError, match='per-sample classification'):
        adapt(method, batch(0), forward=seg_forward)
    assert_state_unchanged(model, before)


@pytest.mark.parametrize('name', PER_SAMPLE_AND_PIXEL)
def test_per_sample_logits_rejected_when_configured_per_pixel(name):
    """The other way round: configured for per-pixel outputs, given
    per-sample head outputs."""
    net = make_seg_net()
    method = build(name)
    method.configure(net, SEG_ADAPTER)

    def cls_forward(model, x):
        logits = model[3].weight.new_zeros(x.shape[0], C) + \
            model[1].weight.sum()
        return logits, [(torch.randn(x.shape[0], 8, dtype=x.dtype), logits)]

    before = copy.deepcopy(net.state_dict())
    with pytest.raises(ValueError, match=r'configured for per-pixel .*'
                       r'\(2, 5\)'):
        adapt(method, seg_images(0), forward=cls_forward)
    assert_state_unchanged(net, before)


def test_per_sample_logits():
    feats = torch.randn(4, 3)
    logits = torch.randn(4, C)
    pair = (feats, logits)
    assert per_sample_logits([pair], 'X') == pair
    f, z = per_sample_logits([pair, (feats[:2], logits[:2])], 'X')
    assert torch.equal(f, torch.cat([feats, feats[:2]]))
    assert torch.equal(z, torch.cat([logits, logits[:2]]))
    with pytest.raises(ValueError,
                       match=r'SAR supports per-sample .*\(2, 5, 3, 3\)'):
        per_sample_logits([pair, (torch.randn(2, 3, 3, 3),
                                  torch.randn(2, C, 3, 3))], 'SAR')
    # the methods' base losses (SAR's reliable entropy) on a forward pass
    # with per-pixel head outputs
    for name in PER_SAMPLE_AND_PIXEL:
        method = build(name)
        model = make_model()
        method.configure(model, CNN_ADAPTER)
        z = torch.randn(2, C, 3, 3, dtype=torch.float64)
        fwd = ForwardPass(z, [(torch.randn(2, 16, 3, 3), z)])
        with pytest.raises(ValueError, match='per-sample classification'):
            if name == 'sar':
                method.reliable_entropy(fwd)
            else:
                method.base_loss(Batch(batch(0, n=2)), fwd)


def test_flatten_outputs_pixels_as_samples_in_order():
    """Per-pixel pairs: pixel (n, i, j) of a pair is row n*h*w + i*w + j;
    crops are concatenated in order; per-sample pairs pass unchanged."""
    feats = torch.randn(2, 3, 2, 4, dtype=torch.float64)
    logits = torch.randn(2, C, 2, 4, dtype=torch.float64)
    f, z = flatten_outputs([(feats, logits)], 'X')
    assert f.shape == (16, 3) and z.shape == (16, C)
    for n in range(2):
        for i in range(2):
            for j in range(4):
                row = n * 8 + i * 4 + j
                assert torch.equal(z[row], logits[n, :, i, j])
                assert torch.equal(f[row], feats[n, :, i, j])
    # two crops (sliding windows): all the first crop's pixels, then the
    # second's
    crop = (torch.randn(2, 3, 3, 3, dtype=torch.float64),
            torch.randn(2, C, 3, 3, dtype=torch.float64))
    f2, z2 = flatten_outputs([(feats, logits), crop], 'X', 'per_pixel')
    assert z2.shape == (16 + 18, C) and f2.shape == (34, 3)
    assert torch.equal(z2[:16], z) and torch.equal(f2[:16], f)
    assert torch.equal(z2[16 + 9 + 2 * 3 + 1], crop[1][1, :, 2, 1])
    # the rows keep the graph
    w = torch.ones(C, dtype=torch.float64, requires_grad=True)
    flatten_outputs([(feats, logits * w[:, None, None])], 'X')[1].sum(
    ).backward()
    torch.testing.assert_close(w.grad, logits.sum((0, 2, 3)))
    # per-sample pairs: unchanged, or concatenated
    pair = (torch.randn(4, 3), torch.randn(4, C))
    assert flatten_outputs([pair], 'X') == pair
    f, z = flatten_outputs([pair, pair], 'X', 'per_sample')
    assert torch.equal(z, torch.cat([pair[1], pair[1]]))
    # refusals
    with pytest.raises(ValueError, match=r'X was configured for per-sample '
                       r'.*\(2, 5, 2, 4\)'):
        flatten_outputs([(feats, logits)], 'X', 'per_sample')
    with pytest.raises(ValueError, match=r'X was configured for per-pixel '
                       r'.*\(4, 5\)'):
        flatten_outputs([pair], 'X', ('per_pixel', ))
    with pytest.raises(ValueError, match='both per-sample and per-pixel'):
        flatten_outputs([pair, (feats, logits)], 'X')
    with pytest.raises(ValueError, match=r'\[N, C\] .* \[N, C, h, w\]'):
        flatten_outputs([(feats[0], logits[0])], 'X')
    with pytest.raises(ValueError, match='no head outputs'):
        flatten_outputs([], 'X')
