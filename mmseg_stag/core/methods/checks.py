"""Checks of a method's options, with the option named, and of the task
it is configured on; SAR's and DeYO's parameters excluded by module."""
from typing import Tuple

from ..probe import check_prediction_kind


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


def exclude_modules(method, exclude_regex) -> None:
    """Freeze the parameters of ``method`` (configured) in the modules
    ``exclude_regex`` matches, its optimizer rebuilt on the rest (SAR's
    and DeYO's ``exclude_regex``); ``ValueError`` if it matches every
    selected parameter."""
    from ..params import exclude_by_module
    if exclude_regex is None:
        return
    kept = exclude_by_module(method.params, exclude_regex)
    if not kept:
        raise ValueError(
            f'{method.name}: every parameter of trainable='
            f'{method.trainable_cfg} matches exclude_regex='
            f'{exclude_regex!r}')
    if len(kept) != len(method.params):
        method.params = kept
        method.optimizer = method.build_optimizer()
