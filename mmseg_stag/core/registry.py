"""The method registry, building a method, and the checks of a method's
options (with the option named) and of the task it is configured on
(MMEngine only, no MMSeg)."""
from typing import Tuple

from mmengine.registry import Registry

from .probe import check_prediction_kind

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


def build_method(cfg: dict):
    """Build a method of ``METHODS`` whatever the caller's default scope;
    ``type`` a registered name (``KeyError`` listing the known ones if
    unknown) or a method class (a task's own, e.g. segmentation CoTTA);
    ``ValueError`` for a renamed option (:func:`check_renamed`)."""
    cfg = dict(cfg)
    if 'type' not in cfg:
        raise ValueError(f'a method config needs a type, got {cfg}')
    check_renamed(cfg)
    method_cls = cfg['type']
    if isinstance(method_cls, str):
        found = METHODS.get(method_cls)
        if found is None:
            raise KeyError(f'unknown method {method_cls!r}; available: '
                           f'{sorted(METHODS.module_dict)}')
        method_cls = found
    return METHODS.build(dict(cfg, type=method_cls, _scope_=METHODS.scope))


def check_range(relation: str, **values) -> None:
    """Raise ``ValueError`` for the first of ``values`` (by name) that is
    not ``relation``: ``'> 0'``, ``'>= 0'`` or ``'in [0, 1]'``."""
    holds = {'> 0': lambda v: v > 0, '>= 0': lambda v: v >= 0,
             'in [0, 1]': lambda v: 0.0 <= v <= 1.0}[relation]
    for name, value in values.items():
        if not holds(value):
            raise ValueError(f'{name} must be {relation}, got {value}')


#: what a method may restart at a new stage of the stream (``stage_restart``)
STAGE_RESTARTS = ('optimizer', 'beta_t')


def check_stage_restart(method, names) -> Tuple[str, ...]:
    """Return ``names`` (``stage_restart``) as a tuple in
    :data:`STAGE_RESTARTS` order; ``ValueError`` for an unknown name, or
    one the method as configured does not have: ``'beta_t'`` without
    ``stag``, ``'optimizer'`` for a method that never updates."""
    names = (names, ) if isinstance(names, str) else tuple(names)
    unknown = sorted(set(names) - set(STAGE_RESTARTS))
    if unknown:
        raise ValueError(f'{method.name}: stage_restart names {unknown}; it '
                         f'takes {STAGE_RESTARTS} (a stage from the source '
                         'restarts everything anyway)')
    if 'beta_t' in names and method.stag_loss is None:
        raise ValueError(f"{method.name}: stage_restart has 'beta_t', but "
                         'there is no beta_t without stag=dict(...)')
    if 'optimizer' in names and not method.has_loss:
        raise ValueError(f"{method.name}: stage_restart has 'optimizer', "
                         'but this method as configured makes no update '
                         '(add stag=dict(...) or remove it)')
    return tuple(n for n in STAGE_RESTARTS if n in names)


def check_supports(method, task_adapter) -> None:
    """Raise ``ValueError`` unless ``method`` is defined on the task
    ``task_adapter`` serves: its prediction kind and the original size."""
    kind = check_prediction_kind(task_adapter.prediction_kind)
    supported = method.supported_prediction_kinds
    if kind not in supported:
        raise ValueError(
            f'{method.name} supports {" and ".join(supported)} outputs '
            f'only, but this task gives {kind} outputs (choose another '
            'method)')
    if method.needs_original_size and not task_adapter.has_original_size:
        raise ValueError(
            f'{method.name} as configured needs logits, labels and a loss '
            "at each image's original size (the segmentation task), "
            f'which {type(task_adapter).__name__} does not give')
