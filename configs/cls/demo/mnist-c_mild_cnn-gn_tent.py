# The classification demo's mild CNN-GN TENT row: run `make demo-cls` first
# (it writes the corrupted digits and the source model under
# work_dirs/demo_cls), then
#   python tools/test.py configs/cls/demo/mnist-c_mild_cnn-gn_tent.py \
#       work_dirs/demo_cls/models/gn.pth
_base_ = [
    './_base_/models/cnn-gn.py',
    './_base_/datasets/mnist-c_mild.py',
    '../_base_/methods/tent.py',
    '../_base_/default_runtime.py',
]
test_cfg = dict(
    method=dict(optimizer=dict(type='Adam', lr=1e-3, betas=(0.9, 0.999))))
randomness = dict(seed=0)  # the demo's seed (tools/demo_cls.py --seed)
