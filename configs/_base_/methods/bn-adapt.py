# BN Adapt: BatchNorm layers use the current batch's statistics; no gradient
# step of its own, so no optimizer or trainable parameters (refused without
# stag). A +STAG config adds `stag=...` (and a fresh optimizer per stage,
# `stage_restart`) and updates with the method defaults: Adam 7.5e-6 on the
# norm affine parameters, as TENT's in CoTTA's ACDC code.
test_cfg = dict(
    type='OnlineAdaptationLoop',
    method=dict(type='bn_adapt'))
