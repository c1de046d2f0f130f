# Runtime shared by every classification config: the plugin's scope (its
# registries, children of MMEngine's) and the online runtime. Nothing here
# downloads; MMSeg and MMCV are not needed.
_base_ = ['../../_base_/online_runtime.py']
default_scope = 'mmseg_stag'
env_cfg = dict(cudnn_benchmark=False, dist_cfg=dict(backend='nccl'))
randomness = dict(seed=1)
