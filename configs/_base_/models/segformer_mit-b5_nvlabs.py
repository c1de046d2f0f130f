# SegFormer-B5 with NVlabs' original head (per-level linear MLPs to 768-d,
# linear_fuse 1x1 conv + BN + ReLU, classifier; D=768), as used by the paper
# and CoTTA. Checkpoint: NVlabs' segformer.b5.1024x1024.city.160k.pth after
# `python tools/convert_nvlabs_segformer.py`.
_base_ = ['./segformer_mit-b5.py']
model = dict(
    # MMSeg's MiT with NVlabs' LayerNorm eps (1e-5 in the patch-embedding and
    # attention sr norms, 1e-6 elsewhere), the checkpoint's own numerics
    backbone=dict(
        type='NVMixVisionTransformer',
        patch_embed_norm_eps=1e-5,
        sr_norm_eps=1e-5,
        norm_cfg=dict(type='LN', eps=1e-6)),
    decode_head=dict(
        _delete_=True,
        type='NVSegformerHead',
        in_channels=[64, 128, 320, 512],
        in_index=[0, 1, 2, 3],
        embedding_dim=768,
        channels=768,
        dropout_ratio=0.1,
        num_classes=19,
        norm_cfg={{_base_.norm_cfg}},
        align_corners=False,
        loss_decode=dict(
            type='CrossEntropyLoss', use_sigmoid=False, loss_weight=1.0)))
