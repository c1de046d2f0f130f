# Clean source images for a method's statistics before the stream (EATA's
# Fisher information; the authors use 2,000 clean ImageNet val images):
# Cityscapes val (500 images, labels unused), resized as the stream is.
cityscapes_source_dataloader = dict(
    batch_size=1,
    num_workers=2,
    persistent_workers=False,
    sampler=dict(type='DefaultSampler', shuffle=False),
    dataset=dict(
        type='CityscapesDataset',
        data_root='data/cityscapes',
        data_prefix=dict(
            img_path='leftImg8bit/val', seg_map_path='gtFine/val'),
        pipeline=[
            dict(type='LoadImageFromFile'),
            dict(type='Resize', scale=(960, 540), keep_ratio=True),
            dict(type='PackSegInputs'),
        ]))
