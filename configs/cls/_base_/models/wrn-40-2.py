# RobustBench `Hendrycks2020AugMix_WRN` (CIFAR-100, corruptions zoo):
# WRN-40-2 normalising its [0, 1] input itself (mean = std = 0.5);
# CHECKPOINT: Hendrycks2020AugMix_WRN.pt.
# The classifier the online loop probes is fc, the network's last
# nn.Linear (test_cfg.head_layer would name another module).
model = dict(
    type='OnlineClassifier',
    network=dict(type='WRN40_2_AugMix'))
