# The classification demo's mild CNN-GN TENT setting as a tools/test_cls.py
# config: run `python tools/demo_cls.py` (make demo-cls) first, which
# writes the corrupted digits and the source model under work_dirs/demo_cls.
# beta0/gamma: the demo's choice on the first corruption
# (work_dirs/demo_cls/summary.md); the grid is 1/30/1000 x 10/100.
_base_ = [
    '../_base_/datasets/corruptions.py',
    '../_base_/scenarios/mild.py',
    '../_base_/default_runtime.py',
]
data = dict(
    type='CIFARC',  # the demo data is written in CIFAR-10-C's layout
    data_root='work_dirs/demo_cls/data/MNIST-C',
    severity=5,
    severities=(5, ),  # the files hold severity 5 only
    corruptions={{_base_.corruptions}})
model = dict(
    type='SmallCNN',
    norm='GN',
    width=16,
    groups=4,
    checkpoint='work_dirs/demo_cls/models/gn.pth',
    classifier='fc')
method = dict(
    type='tent', optimizer=dict(type='Adam', lr=1e-3, betas=(0.9, 0.999)))
stag = dict(beta0=1, gamma=10)
rows = ['source', 'base', 'stag']
num_workers = 0
seed = 0  # the demo's seed (tools/demo_cls.py --seed)
log_interval = 0
