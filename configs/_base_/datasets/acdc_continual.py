# Continual Cityscapes -> ACDC (CoTTA's ACDC protocol): the ACDC train
# split of fog -> night -> rain -> snow, repeated `rounds` times in one run,
# resized to 960x540 (keep ratio), batch 1, no shuffle. The prediction is
# resized back to the original 1920x1080 for the metric.
dataset_type = 'ACDCContinualDataset'
data_root = 'data/acdc'
test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='Resize', scale=(960, 540), keep_ratio=True),
    dict(type='LoadAnnotations'),
    dict(type='PackSegInputs'),
    dict(type='LabelsAsUint8'),  # 1 byte a pixel to the GPU, not int64's 8
]
# loader for a GPU: pinned batches copy asynchronously; 4 workers decode
# 1920x1080 PNGs faster than a B5 step (docs/running.md)
test_dataloader = dict(
    batch_size=1,
    num_workers=4,
    pin_memory=True,
    persistent_workers=False,
    sampler=dict(type='DefaultSampler', shuffle=False),
    dataset=dict(
        type=dataset_type,
        data_root=data_root,
        conditions=('fog', 'night', 'rain', 'snow'),
        split='train',
        rounds=10,
        images_per_condition=None,  # N: the first N of each (a smoke test)
        pipeline=test_pipeline))
test_evaluator = dict(type='ContinualIoUMetric')
