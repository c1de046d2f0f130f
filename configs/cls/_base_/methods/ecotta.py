# EcoTTA (Song et al., 2023; patented by Qualcomm per its authors): only
# the meta networks of an EcoTTANetwork train, the whole network in train()
# mode; per batch a self-distilled regularisation step, then an entropy
# step on the samples with H < 0.4 ln C (method defaults: lambda 0.5, SGD
# lr 5e-3, momentum 0.9; batch 64 in the leaf). The CHECKPOINT is the
# warmed-up one of tools/ecotta_warmup.py.
test_cfg = dict(
    type='OnlineAdaptationLoop',
    method=dict(type='ecotta'))
