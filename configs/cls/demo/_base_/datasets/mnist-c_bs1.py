# Batch size 1 (SAR's bs1): one image per step, shuffled, reset between
# corruptions; the first 200 shuffled images of each corruption keep the
# demo's time in bounds (15,000 steps a row otherwise); accuracy %.
_base_ = ['./mnist-c.py']
test_dataloader = dict(
    batch_size=1,
    dataset=dict(scenario=dict(type='batch_size_1', n_per_corruption=200)))
title = 'Batch Size 1'
