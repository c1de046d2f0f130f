"""The registry of online-adaptation methods (MMEngine only, no MMSeg)."""
from mmengine.registry import Registry

#: one registration per method, by the method's own module; a task whose
#: method of a name differs keeps a child registry of its own, which finds
#: every other name here (``SEG_METHODS``: segmentation CoTTA)
METHODS = Registry('online adaptation method', scope='mmseg_stag',
                   locations=['mmseg_stag.core.methods'])


def build_method(cfg: dict, registry: Registry = METHODS):
    """Build a method of ``registry`` (``METHODS`` or a task's child of it)
    whatever the caller's default scope; ``type`` a registered name
    (``KeyError`` listing the known ones if unknown) or a method class."""
    cfg = dict(cfg)
    if 'type' not in cfg:
        raise ValueError(f'a method config needs a type, got {cfg}')
    method_cls = cfg['type']
    if isinstance(method_cls, str):
        found = registry.get(method_cls)
        if found is None:
            known = set(registry.module_dict) | set(METHODS.module_dict)
            raise KeyError(f'unknown method {method_cls!r}; available: '
                           f'{sorted(known)}')
        method_cls = found
    return registry.build(dict(cfg, type=method_cls,
                               _scope_=registry.scope))
