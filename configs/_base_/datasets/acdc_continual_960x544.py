# Continual Cityscapes -> ACDC as Hybrid-TTA's code feeds it
# (local_configs/_base_/datasets/acdc_960x540_repeat.new.py): each image
# resized to exactly 960x544, the aspect ratio not kept (a multiple of its
# 32-px mask patches), no flip, one scale; otherwise acdc_continual.py.
_base_ = ['./acdc_continual.py']
test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='Resize', scale=(960, 544), keep_ratio=False),
    dict(type='LoadAnnotations'),
    dict(type='PackSegInputs'),
    dict(type='LabelsAsUint8'),
]
test_dataloader = dict(dataset=dict(pipeline=test_pipeline))
