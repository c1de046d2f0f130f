# + STAG; beta0/gamma: the demo's choice on the first corruption
# (work_dirs/demo_cls/summary.md; the grid is 1/30/1000 x 10/100).
_base_ = ['./mnist-c_mild_cnn-gn_tent.py']
test_cfg = dict(method=dict(stag=dict(beta0=1, gamma=10)))
