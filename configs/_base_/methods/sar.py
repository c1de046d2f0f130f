# SAR per pixel (docs/methods.md: "EATA, SAR and DeYO per pixel"; as SicTTA's
# segmentation SAR): entropy filter per pixel on both passes (0.4 ln C),
# SAM (rho 0.05) over CoTTA's ACDC Adam, recovery when the EMA of the second
# pass's loss < 0.2; every norm layer (the authors' exclusion of the last
# stage is a ResNet/ViT rule).
test_cfg = dict(
    type='OnlineAdaptationLoop',
    method=dict(
        type='sar',
        entropy_margin=0.4,
        rho=0.05,
        recovery_threshold=0.2,
        exclude_regex=None,
        optimizer=dict(type='Adam', lr=7.5e-6, betas=(0.9, 0.999)),
        stage_restart=('optimizer', ),
        trainable=dict(kind='norm_affine')))
