# BN Adapt: BatchNorm layers use the current batch's statistics.
custom_hooks = [dict(type='TTAHook', method='bn_adapt')]
