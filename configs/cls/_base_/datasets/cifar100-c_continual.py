# Continual: the corruptions in sequence (file order), batch 200, adapting
# on (only the first starts from the source).
_base_ = ['./cifar100-c.py']
test_dataloader = dict(
    batch_size=200, dataset=dict(scenario=dict(type='continual')))
title = 'Continual'
