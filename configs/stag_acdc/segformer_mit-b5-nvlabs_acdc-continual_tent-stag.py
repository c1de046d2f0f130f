# + STAG, beta0/gamma of the paper's Table appendix_hp (ACDC); beta_t restarts
# at beta0 on every stage (docs/acdc-protocol.md)
_base_ = ['./segformer_mit-b5-nvlabs_acdc-continual_tent.py']
test_cfg = dict(method=dict(stag=dict(beta0=500.0, gamma=35.0, eps=1e-8),
                            stage_restart=('optimizer', 'beta_t')))
