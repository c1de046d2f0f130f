_base_ = [
    '../_base_/models/segformer_mit-b5.py', '../_base_/datasets/acdc_continual_960x544.py',
    '../_base_/default_runtime.py', '../_base_/methods/hybrid-tta.py'
]
