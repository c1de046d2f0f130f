# Hybrid-TTA as its code runs it (scripts/ours.py, mmseg/apis/test_feat.py
# `single_gpu_our`): every model in eval mode; the EMA teacher (0.999, every
# parameter) labels each image at the original size (the scored
# prediction); the student, with parallel adapters in every MiT block, sees
# the image with 60 % of its 32-px patches masked at the first level and
# minimises the cross-entropy to the teacher's labels + 0.3 x the masked L1
# of its reconstruction; full or efficient tuning (the blocks frozen but
# their adapters) by the window of its cross-entropy; a fresh Adam 6e-4/8
# per stage; no stochastic restore (docs/methods.md).
test_cfg = dict(
    type='OnlineAdaptationLoop',
    method=dict(
        type='hybrid_tta',
        optimizer=dict(type='Adam', lr=7.5e-5, betas=(0.9, 0.999)),
        stage_restart=('optimizer', ),
        trainable=dict(kind='all'),
        ema_momentum=0.999,
        recon_weight=0.3,
        mask_ratio=0.6,
        mask_patch_size=32,
        mask_seed=42,
        adapter_hidden=5,
        adapter_init='backbone',
        neck_embed_dim=768,
        switch=dict(window=10, margin=0.1, momentum=0.999, threshold=0.0)))
