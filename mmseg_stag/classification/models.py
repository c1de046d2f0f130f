"""Source models of the classification benchmarks and strict weight loading."""
import importlib

import torch.nn as nn
from mmengine.utils import check_file_exist

from mmseg_stag.checkpoint import (check_state_dict, extract_state_dict,
                                   load_checkpoint_file)
from .registry import CLS_MODELS


def import_optional(name: str):
    """Import ``name``, or raise an ImportError naming the install."""
    try:
        return importlib.import_module(name)
    except Exception as err:  # torchvision fails with RuntimeError too
        raise ImportError(f'{name} is needed for this model but cannot be '
                          f'imported ({type(err).__name__}: {err}); install '
                          'the classification extras with `pip install -e '
                          '.[cls]` (torchvision/timm matching your torch)'
                          ) from err


@CLS_MODELS.register_module(name='TorchvisionResNet50')
def torchvision_resnet50(num_classes: int = 1000) -> nn.Module:
    """Build torchvision's ResNet-50 (BatchNorm) with random weights."""
    models = import_optional('torchvision.models')
    return models.resnet50(weights=None, num_classes=num_classes)


@CLS_MODELS.register_module(name='TimmModel')
def timm_model(model_name: str, num_classes: int = 1000,
               **kwargs) -> nn.Module:
    """Build ``timm.create_model(model_name, pretrained=False)``."""
    timm = import_optional('timm')
    if not timm.is_model(model_name):
        close = timm.list_models(f'*{model_name.split("_")[0]}*')[:8]
        raise ValueError(f'TimmModel: timm {timm.__version__} has no model '
                         f'{model_name!r} (model.network.model_name); '
                         f'similar names: {close}')
    return timm.create_model(model_name, pretrained=False,
                             num_classes=num_classes, **kwargs)


def load_weights(model: nn.Module, path: str,
                 allow_unsafe_pickle: bool = False) -> None:
    """Strictly load a ``.pth``/``.bin``/``.safetensors`` file (a ``.npz``:
    an original ViT) into ``model``; a mismatch is a ValueError naming the
    keys."""
    if path.endswith('.npz'):
        load_vit_npz(model, path)
        return
    if path.endswith('.safetensors'):
        check_file_exist(path, 'checkpoint file not found: {}')
        state = import_optional('safetensors.torch').load_file(path)
    else:
        state = load_checkpoint_file(path, allow_unsafe_pickle)
    state = extract_state_dict(state, path)
    own = model.state_dict()
    # the non-persistent buffers: not in the model's state dict, so not
    # read from a file that has them
    for name, _ in model.named_buffers():
        if name not in own:
            state.pop(name, None)
    cold_start = hasattr(model, 'ecotta') and not any(
        k.startswith('ecotta.') for k in state)
    if cold_start:
        if not getattr(model.ecotta, 'allow_cold_start', False):
            raise ValueError(
                f'{path} has no EcoTTA meta networks (ecotta.*): it is a '
                'source checkpoint. Warm the meta networks up on the source '
                'training set first (python tools/ecotta_warmup.py CONFIG '
                f'{path} --train-data ... --out WARM.pth, then test '
                'WARM.pth), or set model.network.allow_cold_start=True to '
                'adapt freshly initialised meta networks (not EcoTTA as '
                'published)')
        own = {k: v for k, v in own.items() if not k.startswith('ecotta.')}
    check_state_dict(own, state, path, type(model).__name__)
    # a cold start leaves the meta networks as initialised (checked above)
    model.load_state_dict(state, strict=not cold_start)


#: where the original (JAX) ViT ``.npz`` files keep their tensors
NPZ_PREFIXES = ('', 'opt/target/', 'params/', 'params/img/')


def npz_mismatches(model: nn.Module, files, prefix: str) -> list:
    """Return the head, patch, grid or depth mismatches timm would hide."""
    def shape(key):
        return tuple(files[prefix + key].shape) if prefix + key in files \
            else None

    proj = model.patch_embed.proj.weight
    pos = shape('Transformer/posembed_input/pos_embedding') or \
        shape('pos_embedding')
    blocks = {int(k[len(prefix):].split('/')[1].split('_')[1])
              for k in files
              if k.startswith(prefix + 'Transformer/encoderblock_')}
    stacked = shape('Transformer/encoderblock/LayerNorm_0/scale')
    found = dict(head=shape('head/bias'),
                 patch_embedding=shape('embedding/kernel'),
                 pos_embedding=pos, blocks=len(blocks) or (
                     None if stacked is None else stacked[0]))
    wanted = dict(head=(model.head.out_features, )
                  if isinstance(model.head, nn.Linear) else None,
                  patch_embedding=tuple(proj.shape[i] for i in (2, 3, 1, 0)),
                  pos_embedding=tuple(model.pos_embed.shape),
                  blocks=len(model.blocks))
    return [f'{name}: file {found[name]} vs model {wanted[name]}'
            for name in wanted if found[name] != wanted[name]]


def load_vit_npz(model: nn.Module, path: str) -> None:
    """Fill a timm ViT from an original ``.npz`` with ``load_pretrained``
    once the file is checked to fit it."""
    check_file_exist(path, 'checkpoint file not found: {}')
    if not (hasattr(model, 'load_pretrained') and
            hasattr(model, 'pos_embed') and hasattr(model, 'blocks')):
        raise ValueError(
            f'{path}: a .npz holds the original (JAX) ViT weights, but the '
            f'model is a {type(model).__name__}, not a timm '
            'VisionTransformer; give its .pth/.safetensors state dict')
    import numpy as np
    try:
        files = np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError) as err:
        raise ValueError(f'{path}: not a readable .npz archive '
                         f'({type(err).__name__}: {err})') from err
    with files:
        prefix = next((p for p in NPZ_PREFIXES
                       if f'{p}embedding/kernel' in files.files), None)
        if prefix is None:
            raise ValueError(f'{path}: no embedding/kernel under '
                             f'{NPZ_PREFIXES}: not an original ViT .npz '
                             f'(keys: {sorted(files.files)[:5]})')
        wrong = npz_mismatches(model, files, prefix)
    if wrong:
        raise ValueError(f'{path} does not match {type(model).__name__}:\n'
                         '  ' + '\n  '.join(wrong))
    try:
        model.load_pretrained(path)
    except (KeyError, RuntimeError) as err:  # a tensor timm looks for
        raise ValueError(f'{path} does not match {type(model).__name__}: '
                         f'{type(err).__name__}: {err}') from err
