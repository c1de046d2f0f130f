# One sample per step (shuffled), reset between corruptions.
scenario = dict(type='batch_size_1')
metric = 'acc'
title = 'Batch Size 1'
