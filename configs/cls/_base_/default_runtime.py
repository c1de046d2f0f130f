# Runtime shared by every classification config: the plugin's scope (its
# registries, children of MMEngine's), logging with the online loop's loss,
# L_STAG and beta. Nothing here downloads; MMSeg and MMCV are not needed.
default_scope = 'mmseg_stag'
custom_imports = dict(imports=['mmseg_stag'], allow_failed_imports=False)
env_cfg = dict(cudnn_benchmark=False, dist_cfg=dict(backend='nccl'))
randomness = dict(seed=1, deterministic=False)
log_processor = dict(type='OnlineAdaptationLogProcessor', by_epoch=False)
log_level = 'INFO'
load_from = None
resume = False
default_hooks = dict(
    timer=dict(type='IterTimerHook'),
    logger=dict(type='LoggerHook', interval=50, log_metric_by_epoch=False))
