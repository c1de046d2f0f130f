"""Hybrid-TTA's code (hhhyyeee/Hybrid-TTA, HEAD 7ea3c93), transcribed onto
an MMSeg 1.x SegFormer for the tests.

Transcribed: ``single_gpu_our`` (mmseg/apis/test_feat.py:75-445, the path
``scripts/ours.py`` takes: no aug-test, no restore, logging dropped),
``update_ema_variables`` (test_feat.py:33-50), ``MaskGenerator``
(segmentors/simmim_encoder_decoder.py:19-57), the masked MiT forward
(backbones/simmim.py:27-102) with the parallel adapters of
mix_transformer_cvp.py:203-213 and pet/adapter.py, ``Scaler``
(utils/scaler.py), ``SimMIMSegFormerDecoder.forward`` (necks/
simmim_neck.py:128-150), ``SimMIMHead.loss`` with mmpretrain's
``PixelReconstructionLoss`` (L1, channel 3), ``_parse_losses``
(simmim_encoder_decoder.py:234-256), ``forward_train_simmim``
(mood_encoder_decoder.py:156-214) and ``FreezeController`` in mode
``loss_seg_with_wma`` (mmseg/ood/base.py). The MiT's attention and MLP and
the decode head are MMSeg 1.x's modules (tested against NVlabs' on their
own); where 0.x and 1.x name a step differently, the comment says which.
"""
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from mmcv.cnn import ConvModule
from mmseg.models.utils import nchw_to_nlc, nlc_to_nchw

#: ``freeze_cfg`` modules "block1".."block4" under MMSeg 1.x's names
BLOCK_PREFIXES = [f'seg.backbone.layers.{i}.1.' for i in range(4)]


class Scaler(nn.Module):

    def __init__(self):
        super().__init__()
        self.register_parameter('scale', nn.Parameter(torch.tensor(1.0)))

    def forward(self, input):
        return input * self.scale


class Adapter(nn.Module):
    """``Adapter(embed_dim, down_sample=5, mode='parallel', scale=None)``."""

    def __init__(self, embed_dim, hidden_dim=5):
        super().__init__()
        self.layer = nn.Sequential(nn.Linear(embed_dim, hidden_dim),
                                   nn.GELU(),
                                   nn.Linear(hidden_dim, embed_dim), Scaler())

    def forward(self, module, input, **kwargs):
        return module(input, **kwargs) + self.layer(input)  # parallel


class MLP(nn.Module):

    def __init__(self, input_dim, embed_dim):
        super().__init__()
        self.proj = nn.Linear(input_dim, embed_dim)

    def forward(self, x):
        return self.proj(x.flatten(2).transpose(1, 2))


def resize(x, size):
    return F.interpolate(x, size=size, mode='bilinear', align_corners=False)


class SimMIMSegFormerDecoder(nn.Module):

    def __init__(self, in_channels, embedding_dim, encoder_stride=4):
        super().__init__()
        c1, c2, c3, c4 = in_channels
        self.linear_c4 = MLP(c4, embedding_dim)
        self.linear_c3 = MLP(c3, embedding_dim)
        self.linear_c2 = MLP(c2, embedding_dim)
        self.linear_c1 = MLP(c1, embedding_dim)
        # SyncBN there; one process and eval mode: a BN with its statistics
        self.linear_fuse = ConvModule(embedding_dim * 4, embedding_dim, 1,
                                      norm_cfg=dict(type='BN'))
        self.decoder = nn.Sequential(
            nn.Conv2d(embedding_dim, encoder_stride**2 * 3, kernel_size=1),
            nn.PixelShuffle(encoder_stride))

    def forward(self, inputs):
        c1, c2, c3, c4 = inputs
        n, _, h, w = c4.shape
        _c4 = self.linear_c4(c4).permute(0, 2, 1).reshape(
            n, -1, c4.shape[2], c4.shape[3])
        _c4 = resize(_c4, c1.size()[2:])
        _c3 = self.linear_c3(c3).permute(0, 2, 1).reshape(
            n, -1, c3.shape[2], c3.shape[3])
        _c3 = resize(_c3, c1.size()[2:])
        _c2 = self.linear_c2(c2).permute(0, 2, 1).reshape(
            n, -1, c2.shape[2], c2.shape[3])
        _c2 = resize(_c2, c1.size()[2:])
        _c1 = self.linear_c1(c1).permute(0, 2, 1).reshape(
            n, -1, c1.shape[2], c1.shape[3])
        _c = self.linear_fuse(torch.cat([_c4, _c3, _c2, _c1], dim=1))
        return self.decoder(_c)


class MaskGenerator:

    def __init__(self, input_size, mask_patch_size=32, model_patch_size=4,
                 mask_ratio=0.6):
        H, W = input_size
        self.input_size = input_size
        self.mask_patch_size = mask_patch_size
        self.model_patch_size = model_patch_size
        self.mask_ratio = mask_ratio
        assert H % self.mask_patch_size == 0
        assert W % self.mask_patch_size == 0
        assert self.mask_patch_size % self.model_patch_size == 0
        self.rand_size = np.zeros(2, dtype=int)
        self.rand_size[0] = self.input_size[0] // self.mask_patch_size
        self.rand_size[1] = self.input_size[1] // self.mask_patch_size
        self.scale = self.mask_patch_size // self.model_patch_size
        self.token_count = self.rand_size[0] * self.rand_size[1]
        self.mask_count = int(np.ceil(self.token_count * self.mask_ratio))

    def __call__(self):
        mask_idx = np.random.permutation(self.token_count)[:self.mask_count]
        mask = np.zeros(self.token_count, dtype=int)
        mask[mask_idx] = 1
        mask = mask.reshape((self.rand_size[0], self.rand_size[1]))
        mask = mask.repeat(self.scale, axis=0).repeat(self.scale, axis=1)
        return torch.from_numpy(mask).unsqueeze(0)


def recon_loss(pred, target, mask, patch_size=4, channel=3):
    """``SimMIMHead.loss`` -> ``PixelReconstructionLoss(criterion='L1',
    channel=3)``."""
    mask = mask.repeat_interleave(patch_size, 1).repeat_interleave(
        patch_size, 2).unsqueeze(1).contiguous()
    loss = torch.nn.L1Loss(reduction='none')(pred, target)
    return (loss * mask).sum() / mask.sum() / channel


class HybridSegmentor(nn.Module):
    """``MOODEncoderDecoder`` with the ``mit_b5_cvp_simmim`` backbone, built
    around a plain MMSeg segmentor ``seg``: the adapters (one per block),
    the mask token and the reconstruction neck."""

    def __init__(self, seg, hidden_dim=5, neck_dim=768):
        super().__init__()
        self.seg = seg
        widths = [stage[1][0].norm2.normalized_shape[0]
                  for stage in seg.backbone.layers]
        self.adapters = nn.ModuleList(
            nn.ModuleList(Adapter(widths[i], hidden_dim) for _ in stage[1])
            for i, stage in enumerate(seg.backbone.layers))
        self.mask_token = nn.Parameter(torch.zeros(1, 1, widths[0]))
        self.recon_neck = SimMIMSegFormerDecoder(
            seg.decode_head.in_channels, neck_dim)

    def extract_feat(self, x, mask=None):
        """``CVPSimMIMMixVisionTransformer.forward``; ``Block.forward``:
        ``x = x + attn(norm1(x)); x = x + adapt_module('mlp', norm2(x))``."""
        outs = []
        for i, layer in enumerate(self.seg.backbone.layers):
            x, hw = layer[0](x)  # patch_embed{i+1} and its norm
            if i == 0 and mask is not None:
                B, L, _ = x.shape
                mask_token = self.mask_token.expand(B, L, -1)
                w = mask.flatten(1).unsqueeze(-1).type_as(mask_token)
                x = x * (1. - w) + mask_token * w
            for j, block in enumerate(layer[1]):
                x = block.attn(block.norm1(x), hw, identity=x)

                def mlp(t, ffn=block.ffn, hw=hw):  # NVlabs' Mlp: no residual
                    return nchw_to_nlc(ffn.layers(nlc_to_nchw(t, hw)))

                x = x + self.adapters[i][j](mlp, block.norm2(x))
            x = nlc_to_nchw(layer[2](x), hw)  # norm{i+1}
            outs.append(x)
        return outs

    def simple_test(self, img, ori_shape):
        """``simple_test`` with ``rescale=True``: slide inference with one
        window (the image) resized to the input size, then to the original
        size, softmax, argmax."""
        logit = self.seg.decode_head(self.extract_feat(img))
        logit = resize(logit, img.shape[2:])  # encode_decode
        logit = resize(logit, ori_shape)  # inference: rescale
        return F.softmax(logit, dim=1).argmax(dim=1)

    def forward_train_simmim(self, img, gt_semantic_seg, mask_generator,
                             recon_lambda):
        """``forward_train_simmim`` and ``_parse_losses``."""
        mask = mask_generator()
        img_latent = self.extract_feat(img, mask=mask)
        img_rec = self.recon_neck(img_latent)
        losses = dict(recon_loss=recon_loss(img_rec, img, mask))
        # _decode_head_forward_train: losses() resizes the logits to the
        # label size; CrossEntropyLoss(reduction='none'), mean in parse
        seg_logit = resize(self.seg.decode_head(img_latent),
                           gt_semantic_seg.shape[2:])
        losses['decode.loss_seg'] = F.cross_entropy(
            seg_logit, gt_semantic_seg.squeeze(1), ignore_index=255,
            reduction='none')
        log_vars = {k: v.mean() for k, v in losses.items()}
        loss = log_vars['decode.loss_seg'] + log_vars['recon_loss'] * \
            recon_lambda
        log_vars['loss'] = loss
        return loss, {k: v.item() for k, v in log_vars.items()}, mask


class FreezeController:
    """``FreezeController`` with ``ood_mode='loss_seg_with_wma'``."""

    def __init__(self, threshold=0.0, loss_seg_alpha=0.999, window_size=10,
                 perc=0.1):
        self.threshold = threshold
        self.loss_seg_alpha = loss_seg_alpha
        self.window_size = window_size
        self.perc = perc
        self.window = []
        self.wma_loss = 0.0
        self.frozen_flag = False

    def freeze_components(self, model, freeze):
        for name, param in model.named_parameters():
            for _module in BLOCK_PREFIXES:
                if _module in name:
                    if 'adapter' not in name:
                        param.requires_grad_(not freeze)
                        if freeze:
                            param.grad = None

    def reset(self, model):
        self.freeze_components(model, False)
        self.frozen_flag = False

    def __call__(self, model, loss):
        loss_seg = loss[1]['decode.loss_seg']
        self.window.append(loss_seg)
        if len(self.window) < self.window_size:
            et_flag = False
        else:
            self.wma_loss = np.mean(self.window[-self.window_size:])
            et_flag = self.wma_loss < (1 + self.perc) * self.threshold
        if et_flag:
            if not self.frozen_flag:
                self.freeze_components(model, True)
                self.frozen_flag = True
        elif self.frozen_flag:
            self.freeze_components(model, False)
            self.frozen_flag = False
        self.threshold = self.threshold * self.loss_seg_alpha + \
            loss_seg * (1 - self.loss_seg_alpha)


def update_ema_variables(ema_model, model, alpha_teacher):
    for ema_param, param in zip(ema_model.parameters(), model.parameters()):
        try:
            ema_param.data[:] = alpha_teacher * ema_param[:].data[:] + \
                (1 - alpha_teacher) * param[:].data[:]
        except IndexError:  # the 0-dim Scaler
            ema_param.data = alpha_teacher * ema_param.data + \
                (1 - alpha_teacher) * param.data
    return ema_model


def single_gpu_our(model, ema_model, batches, freeze_ctrl, mask_generator,
                   lr=0.0006 / 8, alpha_teacher=0.999, recon_lambda=0.3,
                   on_image=None):
    """One call of ``single_gpu_our``: one stage (one condition of one
    round). ``on_image(log)`` sees each image's mask, losses and switch."""
    model.eval()
    freeze_ctrl.reset(model)
    param_list = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.Adam(param_list, lr=lr, betas=(0.9, 0.999))
    results = []
    for data in batches:
        model.eval()
        ema_model.eval()
        # data['img'][0] after 0.x's pipeline: 1.x's preprocessor
        preprocessed = ema_model.seg.data_preprocessor(data, False)
        img = preprocessed['inputs']
        ori_shape = preprocessed['data_samples'][0].metainfo['ori_shape']
        with torch.no_grad():
            result = ema_model.simple_test(img, ori_shape)
        loss, log_vars, mask = model.forward_train_simmim(
            img, result.unsqueeze(1), mask_generator, recon_lambda)
        freeze_ctrl(model, (loss, log_vars))
        results.append(result)
        torch.mean(1. * loss).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=False)  # torch 1.9's zero_grad
        ema_model = update_ema_variables(ema_model, model, alpha_teacher)
        if on_image is not None:
            on_image(dict(mask=mask, log_vars=log_vars,
                          frozen=freeze_ctrl.frozen_flag))
    return results
