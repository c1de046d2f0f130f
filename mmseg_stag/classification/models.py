"""Source models of the classification benchmarks and safe weight loading.

* ImageNet-C: torchvision ResNet-50 (BN) and timm ``resnet50_gn`` /
  ``vit_base_patch16_224``, built without downloading anything and filled
  from a local weight file. torchvision and timm are optional extras
  (``pip install -e .[cls]``).
* CIFAR-C: the RobustBench WideResNets of :mod:`.wide_resnet`.

Weights are read with :func:`mmseg_stag.checkpoint.load_checkpoint_file`
(``weights_only=True``; ``allow_unsafe_pickle`` / ``--trust-pickle`` is
the explicit opt-in) and loaded strictly, with errors that name the
missing, unexpected and mis-shaped keys.
"""
import importlib
import os.path as osp
from typing import Optional, Tuple

import torch.nn as nn

from mmseg_stag.checkpoint import extract_state_dict, load_checkpoint_file
from mmseg_stag.core import HeadProbe
from .registry import CLS_MODELS

EXTRA_HINT = ('install the classification extras with `pip install -e '
              '.[cls]` (torchvision/timm matching your torch)')


def import_optional(name: str):
    """Import ``name`` or raise ImportError naming the install command."""
    try:
        return importlib.import_module(name)
    except Exception as err:  # torchvision fails with RuntimeError too
        raise ImportError(f'{name} is needed for this model but cannot be '
                          f'imported ({type(err).__name__}: {err}); '
                          f'{EXTRA_HINT}') from err


@CLS_MODELS.register_module(name='TorchvisionResNet50')
def torchvision_resnet50(num_classes: int = 1000) -> nn.Module:
    """torchvision's ResNet-50 (BatchNorm), random weights (load a file:
    e.g. ``resnet50-19c8e357.pth`` / ``resnet50-0676ba61.pth``)."""
    models = import_optional('torchvision.models')
    return models.resnet50(weights=None, num_classes=num_classes)


@CLS_MODELS.register_module(name='TimmModel')
def timm_model(model_name: str, num_classes: int = 1000,
               **kwargs) -> nn.Module:
    """``timm.create_model(model_name, pretrained=False)``: e.g.
    ``'resnet50_gn'`` (file ``resnet50_gn_a1h2-8fe6c4d0.pth``) or
    ``'vit_base_patch16_224'`` (a ``.pth``/``.safetensors`` state dict or
    the original ``.npz``)."""
    timm = import_optional('timm')
    if not timm.is_model(model_name):
        close = [m for m in timm.list_models(f'*{model_name.split("_")[0]}*')
                 ][:8]
        raise ValueError(f'TimmModel: timm {timm.__version__} has no model '
                         f'{model_name!r} (model.network.model_name); '
                         f'similar names: {close}')
    return timm.create_model(model_name, pretrained=False,
                             num_classes=num_classes, **kwargs)


def read_state_dict(path: str, allow_unsafe_pickle: bool = False):
    """The tensors of a weight file (``.pth``/``.pt``/``.bin`` through the
    safe loader, or ``.safetensors``)."""
    if path.endswith('.safetensors'):
        if not osp.isfile(path):
            raise FileNotFoundError(f'checkpoint file not found: {path}')
        st = import_optional('safetensors.torch')
        return extract_state_dict(st.load_file(path), path)
    return extract_state_dict(load_checkpoint_file(path, allow_unsafe_pickle),
                              path)


def non_persistent_buffers(model: nn.Module) -> set:
    """Full names of the buffers a state dict of ``model`` leaves out."""
    names = set()
    for mod_name, module in model.named_modules():
        for buf in module._non_persistent_buffers_set:
            names.add(f'{mod_name}.{buf}' if mod_name else buf)
    return names


def load_weights(model: nn.Module, path: str,
                 allow_unsafe_pickle: bool = False) -> None:
    """Strictly load a weight file into ``model``.

    Keys of the model's non-persistent buffers (e.g. the AugMix WRN's input
    ``mu``/``sigma``) are dropped from the file if present. A ViT ``.npz``
    goes through timm's own ``load_pretrained``.

    Raises:
        FileNotFoundError: no such file.
        ValueError: the keys or shapes do not match the model.
    """
    if path.endswith('.npz'):
        if not osp.isfile(path):
            raise FileNotFoundError(f'checkpoint file not found: {path}')
        if not hasattr(model, 'load_pretrained'):
            raise ValueError(f'{path}: .npz weights need a timm model with '
                             'load_pretrained (a ViT)')
        model.load_pretrained(path)
        return
    state = read_state_dict(path, allow_unsafe_pickle)
    for key in non_persistent_buffers(model):
        state.pop(key, None)
    own = model.state_dict()
    cold_start = hasattr(model, 'ecotta') and not any(
        k.startswith('ecotta.') for k in state)
    if cold_start:
        own = source_keys_of_ecotta(model, path, own)
    missing = [k for k in own if k not in state]
    unexpected = [k for k in state if k not in own]
    wrong = [f'{k}: file {tuple(state[k].shape)} vs model '
             f'{tuple(own[k].shape)}'
             for k in own if k in state and state[k].shape != own[k].shape]
    if missing or unexpected or wrong:

        def show(keys):
            return ', '.join(keys[:8]) + (' ...' if len(keys) > 8 else '')

        raise ValueError(
            f'{path} does not match {type(model).__name__}:' +
            (f'\n  missing keys ({len(missing)}): {show(missing)}'
             if missing else '') +
            (f'\n  unexpected keys ({len(unexpected)}): {show(unexpected)}'
             if unexpected else '') +
            (f'\n  shape mismatches: {show(wrong)}' if wrong else ''))
    # a cold start leaves the meta networks as initialised (checked above)
    model.load_state_dict(state, strict=not cold_start)


def source_keys_of_ecotta(model: nn.Module, path: str, own: dict) -> dict:
    """The keys a source file fills in an EcoTTA network (all but the meta
    networks), if its ``allow_cold_start`` allows it."""
    if not getattr(model.ecotta, 'allow_cold_start', False):
        raise ValueError(
            f'{path} has no EcoTTA meta networks (ecotta.*): it is a source '
            'checkpoint. Warm the meta networks up on the source training '
            'set first (python tools/ecotta_warmup.py CONFIG '
            f'{path} --train-data ... --out WARM.pth, then test WARM.pth), '
            'or set model.network.allow_cold_start=True to adapt freshly '
            'initialised meta networks (not EcoTTA as published)')
    return {k: v for k, v in own.items() if not k.startswith('ecotta.')}


def build_cls_model(cfg: dict,
                    checkpoint: Optional[str] = None,
                    allow_unsafe_pickle: bool = False
                    ) -> Tuple[nn.Module, str]:
    """Build a source model, load its weights, find its classifier.

    Args:
        cfg: ``dict(type=..., checkpoint=None, classifier=None, **kwargs)``:
            ``checkpoint`` a weight file (``None``: keep the random/
            project-initialised weights), ``classifier`` the classifier's
            module name (``None``: the last ``nn.Linear``).
        checkpoint: overrides ``cfg['checkpoint']``.
        allow_unsafe_pickle: trust the file (``--trust-pickle``).

    Returns:
        ``(model in eval mode, classifier name)``.
    """
    cfg = dict(cfg)
    path = checkpoint or cfg.pop('checkpoint', None)
    cfg.pop('checkpoint', None)
    classifier = cfg.pop('classifier', None)
    model = CLS_MODELS.build(cfg)
    if path:
        load_weights(model, path, allow_unsafe_pickle)
    name, _ = HeadProbe(classifier).find(model)
    return model.eval(), name
