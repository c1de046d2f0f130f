"""MiT's GPU options (``segmentation/models/fast_mit.py``): the attention
through ``scaled_dot_product_attention`` (``attention='sdpa'``) and the
convolutions on views of the tokens (``token_maps='view'``), alone and
together: the outputs and the gradients of MMSeg's MiT in float64, with
the same parameters and state-dict keys, in every stage (spatial
reduction 8, 4, 2 and none)."""
import copy

import pytest
import torch
from mmengine.registry import init_default_scope
from mmseg.models.backbones.mit import EfficientMultiheadAttention, MixFFN
from mmseg.registry import MODELS
from seg_helpers import mit_backbone

import mmseg_stag  # noqa: F401  (registers the components)
from mmseg_stag.segmentation.models import use_attention
from mmseg_stag.segmentation.models.fast_mit import (ATTENTION_CLASSES,
                                                     SDPAEfficientAttention,
                                                     ViewMixFFN)

# head widths 8: stage widths 16/32/40/64, one block each
MIT = dict(embed_dims=8, num_heads=[2, 4, 5, 8], num_layers=[1, 2, 1, 1],
           sr_ratios=[8, 4, 2, 1])


def build(type_, seed=0, **kwargs):
    init_default_scope('mmseg')
    torch.manual_seed(seed)
    model = MODELS.build(mit_backbone(type=type_, **MIT, **kwargs)).double()
    with torch.no_grad():  # norms that are not the identity
        for name, p in model.named_parameters():
            if 'norm' in name or name.endswith(('.2.weight', '.2.bias')):
                p.add_(0.1 * torch.randn_like(p))
    return model.eval()


def outputs_and_grads(model, x):
    outs = model(x)
    loss = sum((o * torch.linspace(-1, 1, o.numel(), dtype=o.dtype)
                .view_as(o)).sum() for o in outs)
    grads = torch.autograd.grad(loss, list(model.parameters()))
    return [o.detach() for o in outs], grads


@pytest.mark.parametrize('type_', ['MixVisionTransformer',
                                   'NVMixVisionTransformer'])
@pytest.mark.parametrize('mode,token_maps', [
    ('sdpa', 'copy'), ('mmseg', 'view'), ('sdpa', 'view')])
def test_options_equal_mmseg_in_float64(type_, mode, token_maps):
    mmseg_mit = build(type_)
    sdpa_mit = copy.deepcopy(mmseg_mit)
    use_attention(sdpa_mit, mode, token_maps)
    kinds = {type(m) for m in sdpa_mit.modules()
             if isinstance(m, (EfficientMultiheadAttention, MixFFN))}
    assert kinds == {ATTENTION_CLASSES[(mode, token_maps)],
                     ViewMixFFN if token_maps == 'view' else MixFFN}
    assert list(sdpa_mit.state_dict()) == list(mmseg_mit.state_dict())
    x = torch.randn(2, 3, 64, 96, dtype=torch.float64)
    got, got_grads = outputs_and_grads(sdpa_mit, x)
    ref, ref_grads = outputs_and_grads(mmseg_mit, x)
    for a, b in zip(got + list(got_grads), ref + list(ref_grads)):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    use_attention(sdpa_mit, 'mmseg')  # and back
    torch.testing.assert_close(sdpa_mit(x)[-1], ref[-1], rtol=0, atol=0)


def test_config_options_build_the_same_model():
    """``attention='sdpa'`` of the NVlabs MiT and the registered
    ``SDPAMixVisionTransformer`` (MMSeg's MiT) load the checkpoints of
    their plain counterparts key for key."""
    plain = build('NVMixVisionTransformer')
    fast = build('NVMixVisionTransformer', attention='sdpa',
                 token_maps='view')
    assert (fast.attention, fast.token_maps) == ('sdpa', 'view')
    fast.load_state_dict(plain.state_dict(), strict=True)
    mmseg_fast = build('SDPAMixVisionTransformer')
    mmseg_fast.load_state_dict(build('MixVisionTransformer').state_dict(),
                               strict=True)
    assert any(isinstance(m, SDPAEfficientAttention)
               for m in mmseg_fast.modules())
    assert any(isinstance(m, ViewMixFFN) for m in mmseg_fast.modules())
    with pytest.raises(ValueError, match="attention must be one of"):
        build('NVMixVisionTransformer', attention='flash')
    with pytest.raises(ValueError, match="token_maps must be one of"):
        build('NVMixVisionTransformer', token_maps='nhwc')


def test_token_views_copy_nothing():
    """With ``token_maps='view'`` a block's convolutions read and write
    the token sequence through views: no ``clone``/``_to_copy`` of a map;
    MMSeg's way copies once per convolution group (its ``nchw_to_nlc``;
    its ``nlc_to_nchw`` is a view the convolution takes as it is)."""
    from host_syncs import count_dispatched_ops
    x = torch.randn(1, 3, 64, 96, dtype=torch.float64)
    copies = {}
    for token_maps in ('copy', 'view'):
        model = build('NVMixVisionTransformer', attention='sdpa',
                      token_maps=token_maps)
        with torch.no_grad():
            ops = count_dispatched_ops(lambda: model(x))
        copies[token_maps] = sum(op in ('clone', '_to_copy', 'copy_')
                                 for op in ops)
    # 5 blocks' MixFFN, 4 spatial reductions (sr > 1)
    assert copies == dict(copy=5 + 4, view=0)
