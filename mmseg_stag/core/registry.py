"""The registry of online-adaptation methods (MMEngine only, no MMSeg)."""
from mmengine.registry import Registry

#: one registration per method, by the method's own module; a task whose
#: method of a name differs builds its own class for that name
#: (segmentation CoTTA: ``SegmentationTask``'s ``OWN_METHODS``)
METHODS = Registry('online adaptation method', scope='mmseg_stag',
                   locations=['mmseg_stag.core.methods'])


#: options of earlier releases, refused with their new spelling
RENAMED = {
    'fresh_optimizer_per_stage': "stage_restart=('optimizer', ...)",
    'stag.restart_beta_per_stage': "stage_restart=(..., 'beta_t') (in the "
                                   'method config, beside stag)',
}


def check_renamed(cfg: dict) -> None:
    """``ValueError`` naming the new spelling of a renamed option in the
    method config ``cfg`` (:data:`RENAMED`)."""
    given = set(cfg) | {f'stag.{k}' for k in (cfg.get('stag') or {})}
    for old in sorted(given & set(RENAMED)):
        raise ValueError(f'test_cfg.method.{old} is now {RENAMED[old]}: '
                         'one option says what a method restarts at a new '
                         'stage (docs/methods.md, CHANGELOG)')


def build_method(cfg: dict, registry: Registry = METHODS):
    """Build a method of ``registry`` (``METHODS`` or a task's child of it)
    whatever the caller's default scope; ``type`` a registered name
    (``KeyError`` listing the known ones if unknown) or a method class;
    ``ValueError`` for a renamed option (:func:`check_renamed`)."""
    cfg = dict(cfg)
    if 'type' not in cfg:
        raise ValueError(f'a method config needs a type, got {cfg}')
    check_renamed(cfg)
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
