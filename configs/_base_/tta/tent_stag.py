# TENT + STAG (paper Table appendix_hp, ACDC: beta0=500, gamma=35).
custom_hooks = [
    dict(
        type='TTAHook',
        method=dict(type='tent', loss='entropy'),
        stag=dict(beta0=500.0, gamma=35.0, eps=1e-8),
        optimizer=dict(type='Adam', lr=7.5e-6, betas=(0.9, 0.999)),
        trainable=dict(kind='norm_affine'))
]
