_base_ = [
    '../_base_/models/segformer_mit-tiny.py', '../_base_/datasets/acdc_demo.py',
    '../_base_/default_runtime.py', '../_base_/methods/hybrid-tta.py'
]
# the reconstruction neck as wide as the small model's head (B5's: 768)
test_cfg = dict(method=dict(neck_embed_dim=64))
