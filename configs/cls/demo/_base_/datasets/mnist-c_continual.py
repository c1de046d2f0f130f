# Continual (the CIFAR-C protocol): corruptions in sequence, file order,
# no reset; error %.
_base_ = ['./mnist-c.py']
test_dataloader = dict(dataset=dict(scenario=dict(type='continual')))
test_evaluator = dict(table_metric='err')
title = 'Continual'
