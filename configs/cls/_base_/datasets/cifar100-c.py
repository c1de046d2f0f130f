# CIFAR-100-C as released: <data_root>/<corruption>.npy (5 severities x
# 10,000 uint8 HWC images) and labels.npy; [0, 1] inputs (RobustBench).
_base_ = ['./corruptions.py']
test_dataloader = dict(
    batch_size=200,
    num_workers=2,
    persistent_workers=False,
    sampler=dict(type='DefaultSampler', shuffle=False),
    batch_sampler=dict(type='StageBatchSampler'),  # never across stages
    collate_fn=dict(type='pseudo_collate'),
    dataset=dict(
        type='CorruptionStream',
        corruption_set=dict(
            type='CIFARC', data_root='data/CIFAR-100-C', severity=5,
            n_examples=10000),
        corruptions={{_base_.corruptions}},
        scenario=dict(type='continual'),
        shuffle_seed=1))
test_evaluator = dict(type='StreamAccuracyMetric', table_metric='err')
