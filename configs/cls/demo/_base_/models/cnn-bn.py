# The demo's CNN with BatchNorm (stands in for ResNet-50-BN); inputs [0, 1].
# The classifier the online loop probes is fc, the network's last
# nn.Linear (test_cfg.head_layer would name another module).
model = dict(
    type='OnlineClassifier',
    network=dict(type='SmallCNN', norm='BN', width=16))
