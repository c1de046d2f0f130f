# Runtime shared by every STAG segmentation config: MMSeg scope, the online
# runtime, visualisation. Nothing here downloads.
_base_ = ['./online_runtime.py']
default_scope = 'mmseg'
env_cfg = dict(
    cudnn_benchmark=False,
    mp_cfg=dict(mp_start_method='fork', opencv_num_threads=0),
    dist_cfg=dict(backend='nccl'),
)
vis_backends = [dict(type='LocalVisBackend')]
visualizer = dict(
    type='SegLocalVisualizer', vis_backends=vis_backends, name='visualizer')
default_hooks = dict(visualization=dict(type='SegVisualizationHook'))
