# The demo's CNN with BatchNorm (stands in for ResNet-50-BN); inputs [0, 1].
model = dict(
    type='OnlineClassifier',
    network=dict(type='SmallCNN', norm='BN', width=16),
    classifier='fc')
