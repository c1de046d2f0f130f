# CoTTA as CoTTA's ACDC code runs it (mmseg/apis/test.py `single_gpu_cotta`,
# tools/cotta.py): every parameter trained, a fresh Adam 6e-5/8 per stage,
# an EMA teacher (0.999) on all the pipeline's views (ScaleFlipViews), the
# source model's confidence at the main view > 0.69 keeping the teacher's
# main-view label (else its multi-view label), cross-entropy to that label
# at the original size, stochastic restore (0.01); the label is evaluated.
test_cfg = dict(
    type='OnlineAdaptationLoop',
    method=dict(
        type='cotta',
        optimizer=dict(type='Adam', lr=7.5e-6, betas=(0.9, 0.999)),
        stage_restart=('optimizer', ),
        trainable=dict(kind='all'),
        ema_momentum=0.999,
        restore_prob=0.01,
        ap=0.69))
