# Continual (the CIFAR-C protocol): corruptions in sequence, file order,
# adapting on (only the first starts from the source); error %.
_base_ = ['./mnist-c.py']
test_dataloader = dict(dataset=dict(scenario=dict(type='continual')))
test_evaluator = dict(table_metric='err')
title = 'Continual'
