# Online imbalanced label shift, imbalance ratio inf: each corruption's
# stream sorted by class (class order shuffled with the seed), batch 64.
_base_ = ['./imagenet-c.py']
test_dataloader = dict(
    batch_size=64, dataset=dict(scenario=dict(type='label-shift')))
title = 'Label Shifts'
