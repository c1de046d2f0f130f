# + STAG. The paper gives no ACDC beta0/gamma for this method (Table
# appendix_hp): TENT+STAG's ACDC values (mmseg_stag/paper/hparams.py
# OUR_STAG); beta_t restarts at beta0 on every stage.
_base_ = ['./segformer_mit-b5-nvlabs_acdc-continual_eata.py']
test_cfg = dict(method=dict(stag=dict(beta0=500.0, gamma=35.0, eps=1e-8),
                            stage_restart=('optimizer', 'beta_t')))
