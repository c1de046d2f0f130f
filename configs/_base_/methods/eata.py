# EATA per pixel (docs/methods.md: "EATA, SAR and DeYO per pixel"): entropy and
# redundancy filters and weights per pixel (the authors' defaults: E0 = 0.4
# ln C, d_margin 0.05), the EWC term with the Fisher information of clean
# Cityscapes val images (alpha 2000); the optimizer, parameters and
# per-stage fresh optimizer of CoTTA's ACDC TENT.
_base_ = ['../datasets/cityscapes_source.py']
test_cfg = dict(
    type='OnlineAdaptationLoop',
    source_dataloader={{_base_.cityscapes_source_dataloader}},
    method=dict(
        type='eata',
        entropy_margin=0.4,
        d_margin=0.05,
        fisher_alpha=2000.0,
        optimizer=dict(type='Adam', lr=7.5e-6, betas=(0.9, 0.999)),
        stage_restart=('optimizer', ),
        trainable=dict(kind='norm_affine')))
