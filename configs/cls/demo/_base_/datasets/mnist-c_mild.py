# Mild (the ImageNet-C protocol): one corruption at a time, shuffled, each
# from the source; accuracy %.
_base_ = ['./mnist-c.py']
test_dataloader = dict(dataset=dict(scenario=dict(type='mild')))
title = 'Mild'
