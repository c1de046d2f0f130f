# Mixed: all 15 corruptions shuffled into one stream, batch 64.
_base_ = ['./imagenet-c.py']
test_dataloader = dict(batch_size=64, dataset=dict(scenario=dict(type='mixed')))
title = 'Mix Shifts'
