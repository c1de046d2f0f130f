_base_ = [
    '../_base_/models/segformer_mit-tiny.py', '../_base_/datasets/acdc_demo.py',
    '../_base_/default_runtime.py', '../_base_/methods/bn-adapt.py'
]
