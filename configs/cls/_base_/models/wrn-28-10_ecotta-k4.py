# EcoTTA's network: the wrn-28-10 with K=4 meta networks attached (the frozen
# network keeps its module names; the meta networks are network.ecotta.*).
# CHECKPOINT: the warmed-up file of tools/ecotta_warmup.py (from Standard).
_base_ = ['./wrn-28-10.py']
model = dict(
    network=dict(
        _delete_=True, type='EcoTTANetwork', network=dict(type='WRN28_10_Standard'),
        K=4))
