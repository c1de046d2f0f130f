# Label shift, imbalance ratio inf (the ImageNet-C protocol of SAR's
# label_shifts_bs1): each corruption's stream sorted by class (class order
# shuffled with the seed), batch 64, each corruption from the source;
# accuracy %.
_base_ = ['./mnist-c.py']
test_dataloader = dict(
    batch_size=64, dataset=dict(scenario=dict(type='label-shift')))
title = 'Label Shifts'
