# A corrupted test set as one stream (CorruptionStream: the scenario's
# order, samples tagged with their stage), in stage-aligned batches, scored
# per stage and per corruption. The benchmark files set the images.
_base_ = ['./corruptions.py']
test_dataloader = dict(
    batch_size=64,
    num_workers=8,  # JPEG decoding at batch 64 keeps 2 workers behind a GPU
    pin_memory=True,
    persistent_workers=False,
    sampler=dict(type='DefaultSampler', shuffle=False),
    batch_sampler=dict(type='StageBatchSampler'),  # never across stages
    collate_fn=dict(type='pseudo_collate'),
    dataset=dict(
        type='CorruptionStream',
        corruptions={{_base_.corruptions}},
        scenario=dict(type='mild'),
        shuffle_seed=1))
test_evaluator = dict(type='StreamAccuracyMetric', table_metric='acc')
