# The classification demo's stream: 15 ImageNet-C corruptions (severity 5)
# of real MNIST digits, written by `make demo-cls` in CIFAR-10-C's layout
# (one severity per file), batch 64.
_base_ = ['../../../_base_/datasets/corruption_stream.py']
test_dataloader = dict(
    num_workers=0,
    pin_memory=False,  # the demos run on the CPU
    dataset=dict(
        corruption_set=dict(
            type='CIFARC',
            data_root='work_dirs/demo_cls/data/MNIST-C',
            severity=5,
            severities=(5, )),
        shuffle_seed=0))
