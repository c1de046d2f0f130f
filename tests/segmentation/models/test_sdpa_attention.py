"""MiT's attention through ``scaled_dot_product_attention``
(``attention='sdpa'``): the outputs and the gradients of MMSeg's
``EfficientMultiheadAttention`` in float64, with the same parameters and
state-dict keys, in every stage (spatial reduction 8, 4, 2 and none)."""
import copy

import pytest
import torch
from mmengine.registry import init_default_scope
from mmseg.models.backbones.mit import EfficientMultiheadAttention
from mmseg.registry import MODELS

import mmseg_stag  # noqa: F401  (registers the components)
from mmseg_stag.segmentation.models import use_attention
from mmseg_stag.segmentation.models.sdpa_attention import \
    SDPAEfficientAttention
from seg_helpers import mit_backbone

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
def test_sdpa_equals_mmseg_attention_in_float64(type_):
    mmseg_mit = build(type_)
    sdpa_mit = copy.deepcopy(mmseg_mit)
    use_attention(sdpa_mit, 'sdpa')
    kinds = {type(m) for m in sdpa_mit.modules()
             if isinstance(m, EfficientMultiheadAttention)}
    assert kinds == {SDPAEfficientAttention}
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
    fast = build('NVMixVisionTransformer', attention='sdpa')
    assert fast.attention == 'sdpa'
    fast.load_state_dict(plain.state_dict(), strict=True)
    mmseg_fast = build('SDPAMixVisionTransformer')
    mmseg_fast.load_state_dict(build('MixVisionTransformer').state_dict(),
                               strict=True)
    assert any(isinstance(m, SDPAEfficientAttention)
               for m in mmseg_fast.modules())
    with pytest.raises(ValueError, match="attention must be one of"):
        build('NVMixVisionTransformer', attention='flash')
