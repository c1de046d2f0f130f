# DeYO per pixel (docs/methods.md: "EATA, SAR and DeYO per pixel"; as MLMP's
# DeYOContinual): 4x4 patch shuffle of the image, PLPD per pixel, filters
# (entropy < 0.5 ln C, PLPD > 0.2) and weights per pixel; CoTTA's ACDC
# Adam; every norm layer (the authors' exclusion is a ResNet/ViT rule).
test_cfg = dict(
    type='OnlineAdaptationLoop',
    method=dict(
        type='deyo',
        deyo_margin=0.5,
        reweight_margin=0.4,
        plpd_threshold=0.2,
        patch_len=4,
        exclude_regex=None,
        optimizer=dict(type='Adam', lr=7.5e-6, betas=(0.9, 0.999)),
        stage_restart=('optimizer', ),
        trainable=dict(kind='norm_affine')))
