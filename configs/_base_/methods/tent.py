# TENT exactly as CoTTA's ACDC code runs it (mmseg/apis/test.py
# `single_gpu_tent`, tools/tent.py): affine parameters of every norm layer,
# model in eval mode, a fresh Adam (lr 6e-5/8 = 7.5e-6) for every stage,
# cross-entropy to the model's own prediction at the original image size.
# loss='entropy' is the paper's general TENT (eq:ent); 'pseudo_ce' the same
# cross-entropy at the head's resolution.
test_cfg = dict(
    type='OnlineAdaptationLoop',
    method=dict(
        type='tent',
        loss='pseudo_ce_fullres',
        optimizer=dict(type='Adam', lr=7.5e-6, betas=(0.9, 0.999)),
        stage_restart=('optimizer', ),
        trainable=dict(kind='norm_affine')))
