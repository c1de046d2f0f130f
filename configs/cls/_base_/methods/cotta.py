# CoTTA (Wang et al., 2022): EMA teacher, augmentation-averaged pseudo
# labels, stochastic restore (method defaults).
test_cfg = dict(
    type='OnlineAdaptationLoop',
    method=dict(type='cotta',
                # test-batch BN statistics (the authors' code)
                bn_batch_stats=True))
