# BN Adapt: test-batch statistics; +STAG updates the affine parameters with
# beta_t * L_STAG alone (optimizer in the -stag leaf config: refused without
# stag).
test_cfg = dict(
    type='OnlineAdaptationLoop',
    method=dict(type='bn_adapt'))
