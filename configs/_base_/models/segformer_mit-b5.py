# SegFormer-B5 as in MMSeg 1.x's model zoo: MMSeg's own SegFormer base at the
# B5 size its segformer_mit-b5_8xb1-160k_cityscapes-1024x1024.py sets
# (SegformerHead, channels=256, so the classifier input is D=256). The online
# loop's probe reads the head features at decode_head.conv_seg. Checkpoint:
# MMSeg's segformer_mit-b5_8x1_1024x1024_160k_cityscapes_20211206_072934-87a052ec.pth
_base_ = ['mmseg::_base_/models/segformer_mit-b0.py']
# BN, not the base's SyncBN (a process group); _delete_ drops the base's
# _scope_ key, which MMCV's norm-layer builder would receive as an argument
norm_cfg = dict(_delete_=True, type='BN', requires_grad=True)
model = dict(
    backbone=dict(embed_dims=64, num_layers=[3, 6, 40, 3], init_cfg=None),
    decode_head=dict(in_channels=[64, 128, 320, 512], norm_cfg=norm_cfg))
