"""The registry of online-adaptation methods (MMEngine's ``Registry``: no
MMSeg import)."""
from mmengine.registry import Registry

METHODS = Registry('online adaptation method', scope='mmseg_stag',
                   locations=['mmseg_stag.core.methods'])


def build_method(cfg: dict):
    """Build a method from :data:`METHODS` in its own scope, whatever the
    caller's default scope is (``mmseg`` inside a Runner)."""
    cfg = dict(cfg)
    if 'type' not in cfg:
        raise ValueError(f'a method config needs a type, got {cfg}')
    if isinstance(cfg['type'], str) and cfg['type'] not in METHODS:
        raise KeyError(f"unknown method {cfg['type']!r}; available: "
                       f'{sorted(METHODS.module_dict)}')
    return METHODS.build(dict(cfg, _scope_='mmseg_stag'))
