# BN Adapt + STAG (paper Table appendix_hp, ACDC: beta0=250, gamma=25): norm
# affine parameters updated by beta_t * L_STAG alone, Adam 7.5e-6.
custom_hooks = [
    dict(
        type='TTAHook',
        method='bn_adapt',
        stag=dict(beta0=250.0, gamma=25.0, eps=1e-8),
        optimizer=dict(type='Adam', lr=7.5e-6, betas=(0.9, 0.999)),
        trainable=dict(kind='norm_affine'))
]
