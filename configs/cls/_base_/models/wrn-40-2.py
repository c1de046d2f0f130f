# RobustBench `Hendrycks2020AugMix_WRN` (CIFAR-100, corruptions zoo):
# WRN-40-2 normalising its input with mean = std = 0.5.
model = dict(
    type='WRN40_2_AugMix',
    checkpoint='checkpoints/cifar100/corruptions/Hendrycks2020AugMix_WRN.pt',
    classifier='fc')
