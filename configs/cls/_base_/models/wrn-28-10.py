# RobustBench `Standard` (CIFAR-10, corruptions zoo): WRN-28-10, [0, 1]
# inputs; CHECKPOINT: the released Standard.pt (loads strictly).
# The classifier the online loop probes is fc, the network's last
# nn.Linear (test_cfg.head_layer would name another module).
model = dict(
    type='OnlineClassifier',
    network=dict(type='WRN28_10_Standard'))
