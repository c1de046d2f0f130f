# The demo's CNN with GroupNorm (stands in for ResNet-50-GN); inputs [0, 1].
model = dict(
    type='OnlineClassifier',
    network=dict(type='SmallCNN', norm='GN', width=16, groups=4),
    classifier='fc')
