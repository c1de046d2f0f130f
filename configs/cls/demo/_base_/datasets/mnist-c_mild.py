# Mild (the ImageNet-C protocol): one corruption at a time, shuffled, reset
# between them; accuracy %.
_base_ = ['./mnist-c.py']
test_dataloader = dict(dataset=dict(scenario=dict(type='mild')))
title = 'Mild'
