"""EATA, SAR and DeYO are defined on per-sample classifier outputs
only: a per-pixel task is refused when the method is configured, before any
batch; logits that are not ``[N, C]`` are refused on the batch as well."""
import copy

import pytest
import torch
import torch.nn as nn

from mmseg_stag.core import BatchContext, build_method, per_sample_logits

from reference.adaptation_testbed import C, adapt, assert_state_unchanged
from reference.adaptation_testbed import block_images as batch
from reference.adaptation_testbed import make_cnn as make_model

PER_SAMPLE_ONLY = ('eata', 'sar', 'deyo')


def build(name):
    # ETA: no Fisher information needed before adapting
    return build_method(dict(type=name, fisher_alpha=0) if name == 'eata'
                        else dict(type=name))


@pytest.mark.parametrize('name', PER_SAMPLE_ONLY)
def test_per_pixel_task_refused_at_configure(name):
    method = build(name)
    assert method.supported_outputs == ('per_sample', )
    method.check_output('per_sample')
    with pytest.raises(ValueError, match='supports per_sample outputs only'):
        method.check_output('per_pixel')
    model = make_model()
    flags = [p.requires_grad for p in model.parameters()]
    with pytest.raises(ValueError, match='supports per_sample outputs only'):
        method.configure(model, model[5], 'per_pixel')
    # refused before anything was set up
    assert method.model is None and method.optimizer is None
    assert method.params == []
    assert [p.requires_grad for p in model.parameters()] == flags
    with pytest.raises(RuntimeError, match='configure'):
        adapt(method, lambda m, x: None, batch(0))


@pytest.mark.parametrize('name', ('source', 'bn_adapt', 'tent'))
def test_task_agnostic_methods_take_both_outputs(name):
    per_pixel = nn.Sequential(nn.Conv2d(3, 4, 1), nn.BatchNorm2d(4),
                              nn.Conv2d(4, C, 1))
    for output, model, head in (('per_sample', make_model(), 5),
                                ('per_pixel', per_pixel, 2)):
        method = build_method(dict(type=name))
        method.check_output(output)
        method.configure(model, model[head], output)
        assert method.model is model


@pytest.mark.parametrize('name', PER_SAMPLE_ONLY)
def test_per_pixel_logits_rejected_on_the_batch(name):
    """A method configured for per-sample outputs that is given per-pixel
    head outputs raises, and leaves the model as it was."""
    model = make_model()
    method = build(name)
    method.configure(model, model[5])

    def seg_forward(net, x):
        logits = net[5].weight.new_zeros(x.shape[0], C, 4, 4) + \
            net[1].weight.sum()
        feats = torch.randn(x.shape[0], 16, 4, 4, dtype=x.dtype)
        return logits, [(feats, logits)]

    before = copy.deepcopy(model.state_dict())
    with pytest.raises(ValueError, match='per-sample classification'):
        adapt(method, seg_forward, batch(0))
    assert_state_unchanged(model, before)


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
    # the methods' base losses on a context with per-pixel head outputs
    for name in PER_SAMPLE_ONLY:
        method = build(name)
        model = make_model()
        method.configure(model, model[5])
        z = torch.randn(2, C, 3, 3, dtype=torch.float64)
        ctx = BatchContext(batch(0, n=2), None,
                           head_outputs=[(torch.randn(2, 16, 3, 3), z)])
        with pytest.raises(ValueError, match='per-sample classification'):
            method.base_loss(ctx)
