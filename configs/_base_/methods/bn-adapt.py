# BN Adapt: BatchNorm layers use the current batch's statistics; no gradient
# step of its own. The optimizer and trainable parameters serve a +STAG
# config (which adds `stag=...` and a fresh Adam 7.5e-6 per stage,
# `stage_restart`): norm affine parameters, as TENT's in CoTTA's ACDC code.
test_cfg = dict(
    type='OnlineAdaptationLoop',
    method=dict(
        type='bn_adapt',
        optimizer=dict(type='Adam', lr=7.5e-6, betas=(0.9, 0.999)),
        trainable=dict(kind='norm_affine')))
