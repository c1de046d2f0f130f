"""Which classifier outputs each method takes. EATA, SAR and DeYO take
both (on per-pixel outputs every pixel is a sample,
:func:`flatten_outputs`); a method that declares per-sample outputs only
refuses a per-pixel task when it is configured, before any batch
(``check_supports``, the one check). On a batch, the probe refuses a
classifier input of the other kind, before any loss."""
import copy

import pytest
import torch
import torch.nn as nn
from reference.adaptation_testbed import (CNN_ADAPTER, SEG_ADAPTER, C, adapt,
                                          assert_state_unchanged)
from reference.adaptation_testbed import block_images as batch
from reference.adaptation_testbed import make_cnn as make_model

from mmseg_stag.core import (TENT, HeadProbe, TaskAdapter, build_method,
                             flatten_outputs)

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
    method.check_supports(CNN_ADAPTER)
    with pytest.raises(ValueError, match='supports per_sample outputs only'):
        method.check_supports(SEG_ADAPTER)
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
        method.configure(model, TaskAdapter(
            HeadProbe(str(head), prediction_kind=kind)))
        assert method.model is model


class PermuteLast(nn.Module):
    """[N, D, H, W] -> [N, H, W, D]: a Linear then sees 4-d features."""

    def forward(self, x):
        return x.permute(0, 2, 3, 1)


@pytest.mark.parametrize('name', PER_SAMPLE_AND_PIXEL)
def test_a_classifier_input_of_the_other_kind_fails_the_batch(name):
    """Configured per sample, the classifier gets per-pixel features on
    the batch: the probe raises in the forward pass, before any loss, and
    the model is left as it was."""
    model = nn.Sequential(nn.Conv2d(3, 4, 1), nn.BatchNorm2d(4),
                          PermuteLast(), nn.Linear(4, C)).double()
    method = build(name)
    method.configure(model, TaskAdapter(HeadProbe('3')))
    before = copy.deepcopy(model.state_dict())
    with pytest.raises(ValueError, match='per_sample outputs need 2-d'):
        adapt(method, batch(0))
    assert_state_unchanged(model, before)


def test_per_sample_pairs_concatenated():
    feats = torch.randn(4, 3)
    logits = torch.randn(4, C)
    pair = (feats, logits)
    assert flatten_outputs([pair]) == pair
    f, z = flatten_outputs([pair, (feats[:2], logits[:2])])
    assert torch.equal(f, torch.cat([feats, feats[:2]]))
    assert torch.equal(z, torch.cat([logits, logits[:2]]))


def test_flatten_outputs_pixels_as_samples_in_order():
    """Per-pixel pairs: pixel (n, i, j) of a pair is row n*h*w + i*w + j;
    crops are concatenated in order; per-sample pairs pass unchanged."""
    feats = torch.randn(2, 3, 2, 4, dtype=torch.float64)
    logits = torch.randn(2, C, 2, 4, dtype=torch.float64)
    f, z = flatten_outputs([(feats, logits)])
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
    f2, z2 = flatten_outputs([(feats, logits), crop])
    assert z2.shape == (16 + 18, C) and f2.shape == (34, 3)
    assert torch.equal(z2[:16], z) and torch.equal(f2[:16], f)
    assert torch.equal(z2[16 + 9 + 2 * 3 + 1], crop[1][1, :, 2, 1])
    # the rows keep the graph
    w = torch.ones(C, dtype=torch.float64, requires_grad=True)
    flatten_outputs([(feats, logits * w[:, None, None])])[1].sum(
    ).backward()
    torch.testing.assert_close(w.grad, logits.sum((0, 2, 3)))
    # per-sample pairs: unchanged, or concatenated
    pair = (torch.randn(4, 3), torch.randn(4, C))
    assert flatten_outputs([pair]) == pair
    f, z = flatten_outputs([pair, pair])
    assert torch.equal(z, torch.cat([pair[1], pair[1]]))
