# ImageNet-C: <data_root>/<corruption>/<severity>/<wnid>/*.JPEG, 50,000
# images per corruption; classes in sorted wnid order; resize 256, center
# crop 224 (resize=None gives SAR's ImageNet-C transform); the model's data
# preprocessor normalises. The scenario files set the order and batch size.
_base_ = ['./corruptions.py']
test_dataloader = dict(
    batch_size=64,
    num_workers=2,
    persistent_workers=False,
    sampler=dict(type='DefaultSampler', shuffle=False),
    batch_sampler=dict(type='StageBatchSampler'),  # never across stages
    collate_fn=dict(type='pseudo_collate'),
    dataset=dict(
        type='CorruptionStream',
        corruption_set=dict(
            type='ImageNetC',
            data_root='data/imagenet-c',
            severity=5,
            n_examples=None,
            resize=256,
            crop=224),
        corruptions={{_base_.corruptions}},
        scenario=dict(type='mild'),
        shuffle_seed=1))
test_evaluator = dict(type='StreamAccuracyMetric', table_metric='acc')
