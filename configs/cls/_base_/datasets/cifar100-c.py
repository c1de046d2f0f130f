# CIFAR-100-C as released: <data_root>/<corruption>.npy (5 severities x
# 10,000 uint8 HWC images) and labels.npy; [0, 1] inputs (the AugMix WRN
# normalises itself).
_base_ = ['./corruptions.py']
data = dict(
    type='CIFARC',
    data_root='data/CIFAR-100-C',
    severity=5,
    corruptions={{_base_.corruptions}},
    n_examples=10000)
