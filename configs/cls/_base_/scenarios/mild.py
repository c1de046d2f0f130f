# Batch 64, one corruption at a time (shuffled), reset between corruptions.
scenario = dict(type='mild', batch_size=64)
metric = 'acc'
title = 'Mild'
