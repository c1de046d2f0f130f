# Mild: batch 64, one corruption at a time (shuffled), each from the source.
_base_ = ['./imagenet-c.py']
test_dataloader = dict(batch_size=64, dataset=dict(scenario=dict(type='mild')))
title = 'Mild'
