# All 15 corruptions shuffled into one stream, batch 64.
scenario = dict(type='mixed', batch_size=64)
metric = 'acc'
title = 'Mix Shifts'
