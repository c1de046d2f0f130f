# Runtime shared by every STAG config: MMSeg scope, the plugin import,
# logging, visualisation. Nothing here downloads.
default_scope = 'mmseg'
custom_imports = dict(imports=['mmseg_stag'], allow_failed_imports=False)
env_cfg = dict(
    cudnn_benchmark=False,
    mp_cfg=dict(mp_start_method='fork', opencv_num_threads=0),
    dist_cfg=dict(backend='nccl'),
)
randomness = dict(seed=0, deterministic=False)
vis_backends = [dict(type='LocalVisBackend')]
visualizer = dict(
    type='SegLocalVisualizer', vis_backends=vis_backends, name='visualizer')
# prints the online loop's loss, L_STAG and beta with the ETA
log_processor = dict(type='OnlineAdaptationLogProcessor', by_epoch=False)
log_level = 'INFO'
load_from = None
resume = False
default_hooks = dict(
    timer=dict(type='IterTimerHook'),
    logger=dict(type='LoggerHook', interval=50, log_metric_by_epoch=False),
    visualization=dict(type='SegVisualizationHook'))
