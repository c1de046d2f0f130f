# Online imbalanced label shift, imbalance ratio inf: each corruption's
# stream sorted by class (class order shuffled with the seed), batch 64.
scenario = dict(type='label_shift', batch_size=64)
metric = 'acc'
title = 'Label Shifts'
