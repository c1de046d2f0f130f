# CIFAR-100-C as released, in CIFAR-10-C's layout.
_base_ = ['./cifar10-c.py']
test_dataloader = dict(
    dataset=dict(corruption_set=dict(data_root='data/CIFAR-100-C')))
