"""The registry of online-adaptation methods (MMEngine only, no MMSeg)."""
from mmengine.registry import Registry

#: one registration per method name; a task builds its own variant of a
#: name where the method differs there (``SegmentationTask.VARIANTS``)
METHODS = Registry('online adaptation method', scope='mmseg_stag',
                   locations=['mmseg_stag.core.methods'])


def build_method(cfg: dict):
    """Build a method of ``METHODS`` whatever the caller's default scope;
    ``type`` a registered name (``KeyError`` listing the known ones if
    unknown) or a method class."""
    cfg = dict(cfg)
    if 'type' not in cfg:
        raise ValueError(f'a method config needs a type, got {cfg}')
    method_cls = cfg['type']
    if isinstance(method_cls, str):
        if method_cls not in METHODS:
            raise KeyError(f'unknown method {method_cls!r}; available: '
                           f'{sorted(METHODS.module_dict)}')
        method_cls = METHODS.get(method_cls)
    return METHODS.build(dict(cfg, type=method_cls, _scope_=METHODS.scope))
