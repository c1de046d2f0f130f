# BN Adapt: test-batch statistics; +STAG updates the affine parameters with
# beta_t * L_STAG alone (optimizer in the leaf config).
method = dict(type='bn_adapt')
