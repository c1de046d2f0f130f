# The ACDC stream with CoTTA's teacher views (tools/cotta.py: 960x540 x
# ratios 0.5 ... 2.0, unflipped and flipped = 14 views per image). The
# unflipped view at ratio 1 is the one the student adapts on and the metric
# scores (the loop finds it: ScaleFlipViews.main_view). Fewer views, e.g.:
#   --cfg-options "test_dataloader.dataset.pipeline.1.ratios=[0.5,1.0,1.5]"
_base_ = ['./acdc_continual.py']
# load_label: the label is read once and goes with the scored view at the
# original size (CoTTA's code loads it in each of the 14 views).
test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(
        type='ScaleFlipViews',
        scale=(960, 540),
        ratios=(0.5, 0.75, 1.0, 1.25, 1.5, 1.75, 2.0),
        flip=True,
        load_label=True,
        transforms=[
            dict(type='PackSegInputs'),
        ]),
]
test_dataloader = dict(dataset=dict(pipeline=test_pipeline))
