"""A short STAG sanity run on a tiny, randomly initialised SegFormer.

It builds a MiT + SegformerHead segmentor from MMSeg's registry, takes one
forward pass on a seeded synthetic image, and shows:

1. that the analytic online gradient ``g = s h`` (eq:online_gradient) of a few
   pixels equals ``torch.autograd`` of that pixel's entropy w.r.t. the
   predicted class' row of the 1x1 classifier;
2. ``STAGLoss`` (built with ``MODELS.build``) on the head's features/logits;
3. a few TENT + STAG update steps on the norm layers' affine parameters with
   ``beta_t = beta0 exp(-t / gamma)``, one forward and one backward each.

Usage::

    python tools/stag_sanity_demo.py [--steps 5] [--seed 0]
"""
import argparse

import torch
import torch.nn as nn
from mmseg.registry import MODELS
from mmseg.utils import register_all_modules

from mmseg_stag import stag
from mmseg_stag.core.losses import softmax_entropy

TINY_SEGFORMER = dict(
    type='EncoderDecoder',
    data_preprocessor=dict(type='SegDataPreProcessor', mean=[0, 0, 0],
                           std=[1, 1, 1]),
    backbone=dict(type='MixVisionTransformer', in_channels=3, embed_dims=16,
                  num_stages=4, num_layers=[1, 1, 1, 1],
                  num_heads=[1, 2, 2, 2], patch_sizes=[7, 3, 3, 3],
                  sr_ratios=[8, 4, 2, 1], out_indices=(0, 1, 2, 3)),
    decode_head=dict(type='SegformerHead', in_channels=[16, 32, 32, 32],
                     in_index=[0, 1, 2, 3], channels=32, num_classes=19,
                     norm_cfg=dict(type='BN', requires_grad=True),
                     align_corners=False),
    test_cfg=dict(mode='whole'))


def head_forward(model, images):
    """Logits and classifier inputs of one forward pass at head resolution."""
    captured = {}
    handle = model.decode_head.conv_seg.register_forward_hook(
        lambda mod, inp, out: captured.update(features=inp[0], logits=out))
    try:
        model.encode_decode(images, [dict(img_shape=images.shape[2:])])
    finally:
        handle.remove()
    return captured['features'], captured['logits']


def main():
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--steps', type=int, default=5)
    parser.add_argument('--seed', type=int, default=0)
    args = parser.parse_args()

    register_all_modules()
    torch.manual_seed(args.seed)
    model = MODELS.build(TINY_SEGFORMER).eval()
    conv_seg = model.decode_head.conv_seg
    ys, xs = torch.meshgrid(torch.linspace(-1, 1, 64),
                            torch.linspace(-1, 1, 128), indexing='ij')
    images = torch.stack([xs, ys, xs * ys]).unsqueeze(0)
    images = images + 0.1 * torch.randn_like(images)

    with torch.no_grad():
        features, logits = head_forward(model, images)
    print(f'tiny SegFormer: head features {tuple(features.shape)}, '
          f'logits {tuple(logits.shape)}, classifier '
          f'{tuple(conv_seg.weight.shape)}')

    # 1. analytic g = s h against autograd, for a few pixels (float64)
    weight = conv_seg.weight.detach().flatten(1).double()
    bias = conv_seg.bias.detach().double()
    logits64 = torch.einsum('ndhw,cd->nchw', features.double(),
                            weight) + bias.view(1, -1, 1, 1)
    g_map = stag.online_gradient(features.double(), logits64)
    _, pred = stag.sample_sensitivity(logits64)
    worst = 0.0
    for (i, j) in [(0, 0), (3, 7), (10, 20), (15, 31)]:
        w = weight.clone().requires_grad_(True)
        h = features[0, :, i, j].double()
        ent = softmax_entropy((w @ h + bias)[None])[0]
        (grad_w, ) = torch.autograd.grad(ent, w)
        diff = (grad_w[pred[0, i, j]] - g_map[0, :, i, j]).abs().max().item()
        worst = max(worst, diff)
    print(f'[1] g = s*h vs autograd dH/dw_y on 4 pixels: max |diff| = '
          f'{worst:.2e}')

    # 2. the registered loss
    loss_fn = MODELS.build(dict(type='STAGLoss'))
    value = loss_fn(features, logits, conv_seg.weight, conv_seg.bias)
    print(f'[2] MODELS.build(dict(type="STAGLoss")) -> {loss_fn!r}; '
          f'L_STAG = {value.item():+.4f} over {logits[0, 0].numel()} pixels')

    # 3. TENT + STAG steps on norm affine parameters
    params = [p for m in model.modules()
              if isinstance(m, (nn.LayerNorm, nn.BatchNorm2d))
              for p in (m.weight, m.bias) if p is not None]
    model.requires_grad_(False)
    for p in params:
        p.requires_grad_(True)
    optimizer = torch.optim.Adam(params, lr=1e-3)
    beta0, gamma = 500.0, 35.0
    print(f'[3] TENT + STAG on {sum(p.numel() for p in params)} norm affine '
          f'parameters, beta0={beta0}, gamma={gamma}')
    for step in range(args.steps):
        features, logits = head_forward(model, images)
        ent = softmax_entropy(logits).mean()
        l_stag = loss_fn(features, logits, conv_seg.weight, conv_seg.bias)
        beta = stag.stag_beta(beta0, gamma, step)
        total = ent + beta * l_stag
        optimizer.zero_grad()
        total.backward()
        optimizer.step()
        print(f'    step {step}: entropy {ent.item():.4f}  L_STAG '
              f'{l_stag.item():+.4f}  beta {beta:7.2f}  total '
              f'{total.item():+.3f}')
    print(f'anchors computed {loss_fn.anchor_computations}x '
          '(frozen classifier: once)')


if __name__ == '__main__':
    main()
