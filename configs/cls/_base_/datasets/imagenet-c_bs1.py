# Batch size 1: one image per step (shuffled), reset between corruptions.
_base_ = ['./imagenet-c.py']
test_dataloader = dict(
    batch_size=1, dataset=dict(scenario=dict(type='batch_size_1')))
title = 'Batch Size 1'
