# + STAG; tools/demo.py overrides beta0 with its round-1 fog choice
_base_ = ['./segformer_mit-tiny_demo-acdc_hybrid-tta.py']
test_cfg = dict(method=dict(stag=dict(beta0=500.0, gamma=35.0, eps=1e-8),
                            stage_restart=('optimizer', 'beta_t')))
