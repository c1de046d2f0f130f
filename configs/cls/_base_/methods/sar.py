# SAR (Niu et al., 2023): entropy filter 0.4 ln C, sharpness-aware update,
# model recovery (method defaults).
test_cfg = dict(
    type='OnlineAdaptationLoop',
    method=dict(type='sar',
                # test-batch BN statistics (the authors' code)
                bn_batch_stats=True))
