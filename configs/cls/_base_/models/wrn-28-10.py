# RobustBench `Standard` (CIFAR-10, corruptions zoo): WRN-28-10, [0, 1]
# inputs; CHECKPOINT: the released Standard.pt (loads strictly).
model = dict(
    type='OnlineClassifier',
    network=dict(type='WRN28_10_Standard'),
    classifier='fc')
