# RobustBench `Standard` (CIFAR-10, corruptions zoo): WRN-28-10, [0, 1]
# inputs. The released Standard.pt loads strictly.
model = dict(
    type='WRN28_10_Standard',
    checkpoint='checkpoints/cifar10/corruptions/Standard.pt',
    classifier='fc')
