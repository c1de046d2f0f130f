# The demo's CNN with GroupNorm (stands in for ResNet-50-GN); inputs [0, 1].
# The classifier the online loop probes is fc, the network's last
# nn.Linear (test_cfg.head_layer would name another module).
model = dict(
    type='OnlineClassifier',
    network=dict(type='SmallCNN', norm='GN', width=16, groups=4))
