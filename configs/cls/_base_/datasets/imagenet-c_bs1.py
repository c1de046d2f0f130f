# Batch size 1: the mild stream (shuffled, each corruption from the source),
# one image per step.
_base_ = ['./imagenet-c.py']
test_dataloader = dict(batch_size=1, dataset=dict(scenario=dict(type='mild')))
title = 'Batch Size 1'
