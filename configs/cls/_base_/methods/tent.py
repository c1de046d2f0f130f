# TENT: entropy minimisation, norm-layer affine parameters (optimizer per
# benchmark in the leaf config).
test_cfg = dict(
    type='OnlineAdaptationLoop',
    method=dict(type='tent', loss='entropy',
                # test-batch BN statistics (the authors' code)
                bn_batch_stats=True))
