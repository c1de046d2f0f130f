# TENT as in CoTTA's ACDC code: affine parameters of every norm layer, Adam
# lr 6e-5/8 = 7.5e-6, model in eval mode. loss='entropy' (the paper's TENT) or
# 'pseudo_ce' (cross-entropy to the own argmax at the head's resolution).
test_cfg = dict(
    type='OnlineAdaptationLoop',
    method=dict(
        type='tent',
        loss='entropy',
        optimizer=dict(type='Adam', lr=7.5e-6, betas=(0.9, 0.999)),
        trainable=dict(kind='norm_affine')))
