# TENT: entropy minimisation, norm-layer affine parameters (optimizer per
# benchmark in the leaf config).
method = dict(type='tent', loss='entropy')
