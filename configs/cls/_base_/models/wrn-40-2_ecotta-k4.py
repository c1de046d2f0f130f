# EcoTTA's network: the wrn-40-2 with K=4 meta networks attached (the frozen
# network keeps its module names; the meta networks are network.ecotta.*).
# CHECKPOINT: the warmed-up file of tools/ecotta_warmup.py (from Hendrycks2020AugMix_WRN).
_base_ = ['./wrn-40-2.py']
model = dict(
    network=dict(
        _delete_=True, type='EcoTTANetwork', network=dict(type='WRN40_2_AugMix'),
        K=4))
