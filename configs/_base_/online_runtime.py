# What every online-adaptation config shares, either task: the plugin
# import, the online loop's log line (loss, L_STAG, beta with the ETA) and
# no checkpoint of MMEngine's (tools/test.py loads the source weights).
custom_imports = dict(imports=['mmseg_stag'], allow_failed_imports=False)
randomness = dict(seed=0, deterministic=False)
log_processor = dict(type='OnlineAdaptationLogProcessor', by_epoch=False)
log_level = 'INFO'
load_from = None
resume = False
default_hooks = dict(
    timer=dict(type='IterTimerHook'),
    logger=dict(type='LoggerHook', interval=50, log_metric_by_epoch=False))
