"""The registry of online-adaptation methods (MMEngine only, no MMSeg)."""
from mmengine.registry import Registry

METHODS = Registry('online adaptation method', scope='mmseg_stag',
                   locations=['mmseg_stag.core.methods'])


def build_method(cfg: dict, registry: Registry = METHODS):
    """Build a method from ``registry`` whatever the caller's default scope.

    Raises:
        ValueError: If ``cfg`` has no ``type``.
        KeyError: If the type is unknown, listing the known ones.
    """
    cfg = dict(cfg)
    if 'type' not in cfg:
        raise ValueError(f'a method config needs a type, got {cfg}')
    if isinstance(cfg['type'], str) and cfg['type'] not in registry:
        known = set(registry.module_dict)
        parent = registry.parent
        while parent is not None:
            known |= set(parent.module_dict)
            parent = parent.parent
        raise KeyError(f"unknown method {cfg['type']!r}; available: "
                       f'{sorted(known)}')
    method_cls = cfg['type']
    if isinstance(method_cls, str):
        method_cls = registry.get(method_cls)  # the child, then its parents
    return METHODS.build(dict(cfg, type=method_cls, _scope_=METHODS.scope))
