"""Which parameters a method adapts (and which SAR and DeYO exclude by
module), and how normalisation layers behave."""
import re
from typing import List, Optional, Sequence, Tuple

import torch.nn as nn

#: Normalisation layer families selectable by name in ``norm_types``.
NORM_LAYER_TYPES = {
    'BN': nn.modules.batchnorm._BatchNorm,
    'LN': nn.LayerNorm,
    'GN': nn.GroupNorm,
    'IN': nn.modules.instancenorm._InstanceNorm,
}


def norm_layers(model: nn.Module,
                norm_types: Sequence[str] = ('BN', 'LN', 'GN', 'IN')
                ) -> List[Tuple[str, nn.Module]]:
    """``(name, module)`` of every normalisation layer of ``norm_types``."""
    # by type, not name: MiT's stage-final LayerNorms are ``layers.{i}.2``
    unknown = set(norm_types) - set(NORM_LAYER_TYPES)
    if unknown:
        raise ValueError(f'unknown norm_types {sorted(unknown)}; choose from '
                         f'{sorted(NORM_LAYER_TYPES)}')
    classes = tuple(NORM_LAYER_TYPES[t] for t in norm_types)
    return [(name, m) for name, m in model.named_modules()
            if isinstance(m, classes)]


#: what a ``trainable`` config may say (:func:`select_parameters`)
TRAINABLE_KEYS = ('kind', 'norm_types', 'name_regex')


def check_trainable(trainable: dict) -> None:
    """``ValueError`` naming the option of a ``trainable`` config
    :func:`select_parameters` cannot use: an unknown key or ``kind``, an
    unknown norm type, ``norm_types`` with ``kind='all'`` (which selects
    every parameter, not by layer), a ``name_regex`` that does not
    compile."""
    unknown = sorted(set(trainable) - set(TRAINABLE_KEYS))
    if unknown:
        raise ValueError(f'trainable has unknown keys {unknown}; it takes '
                         f'{list(TRAINABLE_KEYS)}')
    kind = trainable.get('kind', 'norm_affine')
    if kind not in ('norm_affine', 'all'):
        raise ValueError(
            f"trainable kind must be 'norm_affine' or 'all', got {kind!r}")
    norm_types = trainable.get('norm_types')
    if norm_types is not None and kind == 'all':
        raise ValueError(
            f"trainable norm_types={norm_types!r} selects normalisation "
            "layers, but kind='all' selects every parameter: remove "
            "norm_types, or use kind='norm_affine'")
    if norm_types is not None:
        unknown = sorted(set(norm_types) - set(NORM_LAYER_TYPES))
        if unknown:
            raise ValueError(f'unknown trainable norm_types {unknown}; '
                             f'choose from {sorted(NORM_LAYER_TYPES)}')
    name_regex = trainable.get('name_regex')
    if name_regex is not None:
        try:
            re.compile(name_regex)
        except (re.error, TypeError) as err:
            raise ValueError(f'trainable name_regex={name_regex!r} is not a '
                             f'regular expression: {err}') from None


def select_parameters(model: nn.Module,
                      kind: str = 'norm_affine',
                      norm_types: Optional[Sequence[str]] = None,
                      name_regex: Optional[str] = None
                      ) -> List[Tuple[str, nn.Parameter]]:
    """The parameters a method adapts, as ``(name, parameter)``: of
    ``kind`` ``'norm_affine'`` (the weight and bias of the layers of
    ``norm_types``, default every family of :data:`NORM_LAYER_TYPES`) or
    ``'all'`` (``norm_types`` refused), whose names ``name_regex``
    matches (:func:`check_trainable`)."""
    check_trainable(dict(kind=kind, norm_types=norm_types,
                         name_regex=name_regex))
    if kind == 'norm_affine':
        selected = [(f'{mod_name}.{p_name}' if mod_name else p_name, p)
                    for mod_name, m in norm_layers(
                        model, tuple(NORM_LAYER_TYPES)
                        if norm_types is None else norm_types)
                    for p_name, p in m.named_parameters(recurse=False)
                    if p_name in ('weight', 'bias')]
    elif kind == 'all':
        selected = list(model.named_parameters())
    else:
        raise ValueError(
            f"trainable kind must be 'norm_affine' or 'all', got {kind!r}")
    if name_regex is not None:
        pattern = re.compile(name_regex)
        selected = [(n, p) for n, p in selected if pattern.search(n)]
    return selected


def exclude_by_module(params: List[Tuple[str, nn.Parameter]],
                      exclude_regex: str) -> List[Tuple[str, nn.Parameter]]:
    """Freeze and drop the parameters whose module name matches the regex."""
    pattern = re.compile(exclude_regex)
    kept = []
    for name, p in params:
        module_name = name.rsplit('.', 1)[0] if '.' in name else ''
        if pattern.search(module_name):
            p.requires_grad_(False)
        else:
            kept.append((name, p))
    return kept


def exclude_modules(method, exclude_regex) -> None:
    """Freeze the parameters of ``method`` (configured) in the modules
    ``exclude_regex`` matches, its optimizer rebuilt on the rest (SAR's
    and DeYO's ``exclude_regex``); ``ValueError`` if it matches every
    selected parameter."""
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


def use_batch_statistics(model: nn.Module) -> None:
    """Make BatchNorm layers use batch statistics, even in eval mode."""
    for _, m in norm_layers(model, ('BN', )):
        m.track_running_stats = False
        m.running_mean = None
        m.running_var = None
        m.train()
