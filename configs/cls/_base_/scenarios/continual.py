# Continual: the corruptions in sequence (file order), batch 200, no reset.
scenario = dict(type='continual', batch_size=200)
metric = 'err'
title = 'Continual'
