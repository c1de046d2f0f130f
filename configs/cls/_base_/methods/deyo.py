# DeYO (Lee et al., 2024): entropy filter 0.5 ln C, PLPD filter with patch
# shuffling (method defaults).
test_cfg = dict(
    type='OnlineAdaptationLoop',
    method=dict(type='deyo',
                # test-batch BN statistics (the authors' code)
                bn_batch_stats=True))
