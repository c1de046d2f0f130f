# BN Adapt: test-batch statistics; +STAG updates the affine parameters with
# beta_t * L_STAG alone (optimizer in the leaf config).
test_cfg = dict(
    type='OnlineAdaptationLoop',
    method=dict(type='bn_adapt'))
