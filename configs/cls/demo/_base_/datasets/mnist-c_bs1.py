# Batch size 1 (SAR's bs1): the mild stream (shuffled, each corruption from
# the source), one image per step; the first 200 shuffled images of each
# corruption keep the demo's time in bounds (15,000 steps a row otherwise);
# accuracy %.
_base_ = ['./mnist-c.py']
test_dataloader = dict(
    batch_size=1,
    dataset=dict(scenario=dict(type='mild', n_per_corruption=200)))
title = 'Batch Size 1'
