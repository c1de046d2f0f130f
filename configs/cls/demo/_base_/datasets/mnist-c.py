# The classification demo's stream: 15 ImageNet-C corruptions (severity 5)
# of real MNIST digits, written by `make demo-cls` in CIFAR-10-C's layout
# (one severity per file), batch 64.
_base_ = ['../../../_base_/datasets/corruptions.py']
test_dataloader = dict(
    batch_size=64,
    num_workers=0,
    persistent_workers=False,
    sampler=dict(type='DefaultSampler', shuffle=False),
    batch_sampler=dict(type='StageBatchSampler'),
    collate_fn=dict(type='pseudo_collate'),
    dataset=dict(
        type='CorruptionStream',
        corruption_set=dict(
            type='CIFARC',
            data_root='work_dirs/demo_cls/data/MNIST-C',
            severity=5,
            severities=(5, )),
        corruptions={{_base_.corruptions}},
        scenario=dict(type='mild'),
        shuffle_seed=0))
test_evaluator = dict(type='StreamAccuracyMetric', table_metric='acc')
