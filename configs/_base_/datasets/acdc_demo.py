# The generated ACDC-layout stand-in (tools/make_demo_data.py): 256x128
# images, so the real protocol's 960x540 resize becomes 256x128.
_base_ = ['./acdc_continual.py']
test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='Resize', scale=(256, 128), keep_ratio=True),
    dict(type='LoadAnnotations'),
    dict(type='PackSegInputs'),
]
test_dataloader = dict(
    num_workers=0,
    pin_memory=False,  # the demos run on the CPU
    dataset=dict(data_root='work_dirs/demo/data/acdc',
                 pipeline=test_pipeline))
