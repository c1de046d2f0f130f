# Source model of the offline demo: the small SegFormer trained on the clean
# Cityscapes-style stand-in with MMSeg's own training loop (tools/train.py).
_base_ = ['../_base_/models/segformer_mit-tiny.py',
          '../_base_/default_runtime.py']
model = dict(type='EncoderDecoder', data_preprocessor=dict(size=(128, 128)))
data_root = 'work_dirs/demo/data/cityscapes'
crop_size = (128, 128)
train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations'),
    dict(type='RandomResize', scale=(256, 128), ratio_range=(0.75, 1.5),
         keep_ratio=True),
    dict(type='RandomCrop', crop_size=crop_size, cat_max_ratio=0.75),
    dict(type='RandomFlip', prob=0.5),
    dict(type='PhotoMetricDistortion', brightness_delta=16,
         contrast_range=(0.8, 1.2), saturation_range=(0.8, 1.2),
         hue_delta=9),
    dict(type='PackSegInputs')
]
val_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='Resize', scale=(256, 128), keep_ratio=True),
    dict(type='LoadAnnotations'),
    dict(type='PackSegInputs')
]
train_dataloader = dict(
    batch_size=8,
    num_workers=2,
    persistent_workers=True,
    sampler=dict(type='InfiniteSampler', shuffle=True),
    dataset=dict(
        type='CityscapesDataset',
        data_root=data_root,
        data_prefix=dict(img_path='leftImg8bit/train',
                         seg_map_path='gtFine/train'),
        pipeline=train_pipeline))
val_dataloader = dict(
    batch_size=1,
    num_workers=0,
    sampler=dict(type='DefaultSampler', shuffle=False),
    dataset=dict(
        type='CityscapesDataset',
        data_root=data_root,
        data_prefix=dict(img_path='leftImg8bit/val',
                         seg_map_path='gtFine/val'),
        pipeline=val_pipeline))
val_evaluator = dict(type='IoUMetric', iou_metrics=['mIoU'])
test_dataloader = val_dataloader
test_evaluator = val_evaluator

max_iters = 1500
optim_wrapper = dict(
    type='OptimWrapper',
    optimizer=dict(type='AdamW', lr=2e-3, betas=(0.9, 0.999),
                   weight_decay=0.01))
param_scheduler = [
    dict(type='LinearLR', start_factor=0.01, by_epoch=False, begin=0,
         end=50),
    dict(type='PolyLR', eta_min=0.0, power=1.0, begin=50, end=max_iters,
         by_epoch=False)
]
train_cfg = dict(type='IterBasedTrainLoop', max_iters=max_iters,
                 val_interval=max_iters)
val_cfg = dict(type='ValLoop')
test_cfg = dict(type='TestLoop')
default_hooks = dict(
    param_scheduler=dict(type='ParamSchedulerHook'),
    checkpoint=dict(type='CheckpointHook', by_epoch=False,
                    interval=max_iters, max_keep_ckpts=1),
    sampler_seed=dict(type='DistSamplerSeedHook'),
    logger=dict(type='LoggerHook', interval=100, log_metric_by_epoch=False))
randomness = dict(seed=0)
