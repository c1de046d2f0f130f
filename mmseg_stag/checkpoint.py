"""Checkpoint loading with ``weights_only=True`` and publishing as such;
adapted checkpoints (:func:`adapted_checkpoint`) that every reader takes."""
import importlib
import os.path as osp
import pickle
import re
import zipfile
from collections import OrderedDict
from typing import Any, Callable, Dict, List, Optional

import torch
import torch.nn as nn
from mmengine.logging import print_log
from mmengine.utils import check_file_exist
from torch.nn.modules.batchnorm import _BatchNorm

UNSAFE_HINT = (
    'It holds pickled Python objects that the safe loader '
    '(torch.load(weights_only=True)) refuses. If you trust this file, '
    'load it with --trust-pickle (tools/*.py) or allow_unsafe_pickle=True, '
    'or re-publish it once as state_dict + plain meta with '
    '`python tools/publish_checkpoint.py SRC DST --trust-pickle`.')


def load_checkpoint_file(path: str,
                         allow_unsafe_pickle: bool = False) -> Dict[str, Any]:
    """Read a ``.pth`` file onto the CPU; ``allow_unsafe_pickle``
    (``weights_only=False``) is for trusted files only."""
    check_file_exist(path, 'checkpoint file not found: {}')
    try:
        return torch.load(path, map_location='cpu',
                          weights_only=not allow_unsafe_pickle)
    except MemoryError:
        raise
    except Exception as err:  # EOFError, OSError, zip and pickle errors
        raise RuntimeError(unreadable_checkpoint(
            path, err, allow_unsafe_pickle)) from err


#: how a file begins: a zip archive (``torch.save`` since 1.6) and a
#: pickle of protocol 2 to 5 (the legacy format, ``\x80`` + protocol)
ZIP_MAGIC = b'PK\x03\x04'
PICKLE_MAGIC = tuple(bytes([0x80, protocol]) for protocol in range(2, 6))


def first_error_line(err: BaseException) -> str:
    """torch's first line of ``err``: the weights-only unpickler's own
    reason when it gives one, the exception's name when it says nothing."""
    text = re.sub(r'\x1b\[[0-9;]*m', '', str(err))
    if 'WeightsUnpickler error:' in text:
        text = text.split('WeightsUnpickler error:', 1)[1]
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[0].rstrip('.') if lines else type(err).__name__


def looks_like_text(head: bytes) -> bool:
    """A web page, JSON or other text: what a dead download link saves."""
    head = head.lstrip(b'\xef\xbb\xbf \t\r\n')
    if head.startswith((b'<', b'{', b'[')):
        return True
    text = head.decode('utf-8', errors='replace')
    if text.endswith('\ufffd') and len(head) == 512:  # a character cut
        text = text.rstrip('\ufffd')
    return bool(text) and '\ufffd' not in text and all(
        c.isprintable() or c in '\t\r\n\f' for c in text)


def unreadable_checkpoint(path: str, err: BaseException,
                          allow_unsafe_pickle: bool = False) -> str:
    """One sentence on why torch cannot read ``path``, told by the file's
    first bytes and size: empty, a web page or text, a zip cut short, a
    pickle of Python objects (only then ``--trust-pickle``), or torch's
    first error line."""
    try:
        size = osp.getsize(path)
        with open(path, 'rb') as f:
            head = f.read(512)
    except OSError:
        size, head = None, b''
    again = 'download or copy it again'
    if size == 0:
        return f'checkpoint {path} is empty (0 bytes): {again}'
    if looks_like_text(head):
        return (f'checkpoint {path} is a web page / text ({size} bytes, '
                f'begins {head[:40].decode("utf-8", "replace")!r}), not a '
                f'checkpoint: the download failed; {again}')
    first_line = first_error_line(err)
    damaged = (f'checkpoint {path} is cut short or damaged ({size} bytes): '
               f'torch says {first_line}; {again}')
    if head.startswith(ZIP_MAGIC) and not zipfile.is_zipfile(path):
        return damaged  # no end-of-archive record: cut short
    known = head.startswith((ZIP_MAGIC, ) + PICKLE_MAGIC)
    if known and (isinstance(err, EOFError) or 'truncated' in first_line):
        return damaged
    if known and isinstance(err, pickle.UnpicklingError) \
            and not allow_unsafe_pickle:  # Python objects, really
        return (f'cannot load checkpoint {path} safely: {first_line}. '
                f'{UNSAFE_HINT}')
    return f'cannot load checkpoint {path} ({size} bytes): {first_line}'


def extract_state_dict(checkpoint: Dict[str, Any],
                       path: str = '<checkpoint>') -> 'OrderedDict':
    """The weights of a loaded checkpoint, without DDP's ``module.`` prefix.
    """
    if not isinstance(checkpoint, dict):
        raise ValueError(f'{path}: expected a dict checkpoint, got '
                         f'{type(checkpoint).__name__}')
    for key in ('state_dict', 'model'):
        if key in checkpoint and isinstance(checkpoint[key], dict):
            checkpoint = checkpoint[key]
            break
    state = OrderedDict()
    for key, value in checkpoint.items():
        if not isinstance(value, torch.Tensor):
            raise ValueError(f'{path}: entry {key!r} is not a tensor '
                             f'({type(value).__name__}); not a state dict')
        state[key[len('module.'):] if key.startswith('module.') else key] = \
            value
    return state


def check_state_dict(own: Dict[str, torch.Tensor],
                     state: Dict[str, torch.Tensor], path: str,
                     target: str) -> None:
    """Check that a file's weights ``state`` fill ``own`` (the model's, or
    the part the file must fill) key for key, shape for shape; the error
    names ``path``, ``target`` and up to 8 keys of each kind."""
    missing = [k for k in own if k not in state]
    unexpected = [k for k in state if k not in own]
    wrong_shape = [f'{k}: file {tuple(state[k].shape)} vs model '
                   f'{tuple(own[k].shape)}' for k in own
                   if k in state and state[k].shape != own[k].shape]
    if not (missing or unexpected or wrong_shape):
        return

    def show(keys):
        return ', '.join(keys[:8]) + (' ...' if len(keys) > 8 else '')

    raise ValueError(
        f'{path} does not match {target}:'
        + (f'\n  missing keys ({len(missing)}): {show(missing)}'
           if missing else '')
        + (f'\n  unexpected keys ({len(unexpected)}): {show(unexpected)}'
           if unexpected else '')
        + (f'\n  shape mismatches: {show(wrong_shape)}'
           if wrong_shape else ''))


def load_segmentor_checkpoint(model: nn.Module,
                              path: str,
                              allow_unsafe_pickle: bool = False,
                              head_layer: Optional[str] = None
                              ) -> Dict[str, Any]:
    """Strictly load a checkpoint into a segmentor and return its ``meta``;
    the classifier ``head_layer`` is checked first, so a class-count
    mismatch is named."""
    checkpoint = load_checkpoint_file(path, allow_unsafe_pickle)
    state = extract_state_dict(checkpoint, path)
    own = model.state_dict()
    head_layer = head_layer or 'decode_head.conv_seg'
    cls_key = f'{head_layer}.weight'
    if cls_key in own:
        if cls_key not in state:
            raise ValueError(
                f'{path}: no classifier weight {cls_key!r}; the checkpoint '
                'head does not match the config (an NVlabs checkpoint needs '
                'tools/convert_nvlabs_segformer.py and an *nvlabs* config)')
        if state[cls_key].shape != own[cls_key].shape:
            ckpt_c, cfg_c = state[cls_key].shape[0], own[cls_key].shape[0]
            raise ValueError(
                f'{path}: {cls_key!r} has shape {tuple(state[cls_key].shape)}'
                f' but the config builds {tuple(own[cls_key].shape)} '
                f'({ckpt_c} vs {cfg_c} classes, or a different head width)')
    meta = checkpoint.get('meta', {}) if 'state_dict' in checkpoint else {}
    meta = meta if isinstance(meta, dict) else {}
    if meta.get('added_modules'):  # an adapted checkpoint (Hybrid-TTA's)
        attach_added_modules(model, meta['added_modules'], path)
        own = model.state_dict()
    check_state_dict(own, state, path, 'the model built by the config')
    model.load_state_dict(state, strict=True)
    if meta.get('batch_statistics'):
        print_log(f'{path}: its run normalised {len(meta["batch_statistics"])}'
                  ' BatchNorm layers with each frame\'s own statistics; they '
                  'hold the source\'s running statistics, which this model '
                  'uses unless its method sets bn_batch_stats (BN Adapt)',
                  logger='current')
    return meta


def plain_meta(meta: Any) -> Any:
    """Keep what ``weights_only=True`` reads back; numpy scalars as numbers."""
    if isinstance(meta, (str, int, float, bool, type(None))):
        return meta
    if isinstance(meta, dict):
        out = {}
        for k, v in meta.items():
            v = plain_meta(v)
            if v is not None or meta[k] is None:
                out[str(k)] = v
        return out
    if isinstance(meta, (list, tuple)):
        return [plain_meta(v) for v in meta]
    if hasattr(meta, 'item') and getattr(meta, 'ndim', 1) == 0:
        return meta.item()
    return None


def published_checkpoint(src: str,
                         allow_unsafe_pickle: bool = False) -> dict:
    """``src`` as ``{'state_dict': ..., 'meta': plain}``, what the safe
    loader reads (``tools/publish_checkpoint.py`` writes it through
    ``engine.report.write_torch``)."""
    checkpoint = load_checkpoint_file(src, allow_unsafe_pickle)
    state = extract_state_dict(checkpoint, src)  # a dict, or an error
    meta = plain_meta(checkpoint.get('meta', {}))
    return {'state_dict': state, 'meta': meta or {}}


def load_model_checkpoint(model: nn.Module, path: str,
                          allow_unsafe_pickle: bool = False,
                          head_layer: Optional[str] = None) -> None:
    """Strictly load the source weights of a classifier or a segmentor."""
    if hasattr(model, 'load_weights'):
        model.load_weights(path, allow_unsafe_pickle)
    else:
        load_segmentor_checkpoint(model, path,
                                  allow_unsafe_pickle=allow_unsafe_pickle,
                                  head_layer=head_layer)


#: the adders of the modules a method attaches to a segmentor, by the
#: ``type`` of a checkpoint's ``meta['added_modules']``: ``adder(model,
#: **options)`` attaches them and sets ``model.added_modules`` to its spec
MODULE_ADDERS: Dict[str, Callable[..., Any]] = {}
#: the modules that register the adders (imported when one is looked up)
ADDER_LOCATIONS = ('mmseg_stag.segmentation.models.hybrid_tta_modules', )


def register_module_adder(name: str) -> Callable:
    """Register ``adder(model, **options)`` under ``name``."""
    def register(adder: Callable) -> Callable:
        MODULE_ADDERS[name] = adder
        return adder

    return register


def module_adder(kind: Any, source: str) -> Callable:
    """The adder registered as ``kind`` (``ValueError`` naming
    ``source`` if none is)."""
    if kind not in MODULE_ADDERS:
        for location in ADDER_LOCATIONS:
            importlib.import_module(location)
    if kind not in MODULE_ADDERS:
        raise ValueError(f'{source} names added modules of type {kind!r}, '
                         f'which this version does not know (known: '
                         f'{sorted(MODULE_ADDERS)})')
    return MODULE_ADDERS[kind]


def attach_added_modules(model: nn.Module, spec: dict,
                         source: str = '<checkpoint>') -> Optional[Any]:
    """Attach the modules ``spec`` (``dict(type=..., **options)``, what a
    checkpoint's ``meta['added_modules']`` records) to ``model``, unless
    they are attached already with the same options (then None); return
    what the adder returns (Hybrid-TTA's: parameter counts).

    Raises:
        ValueError: If ``spec`` has an unknown type, or other modules or
            options are attached already (naming ``source``).
    """
    if not isinstance(spec, dict) or 'type' not in spec:
        raise ValueError(f'{source}: added_modules must be a dict with a '
                         f'type, got {spec!r}')
    spec = dict(spec)
    adder = module_adder(spec['type'], source)
    attached = getattr(model, 'added_modules', None)
    if attached is not None:
        if dict(attached) != spec:
            raise ValueError(f'{source} asks for the added modules {spec}, '
                             f'but the model has {dict(attached)} attached')
        return None
    options = {k: v for k, v in spec.items() if k != 'type'}
    return adder(model, **options)


#: a BatchNorm layer's buffers, in the order PyTorch registers them
BN_BUFFERS = ('running_mean', 'running_var', 'num_batches_tracked')


def bn_buffers(model: nn.Module) -> Dict[str, torch.Tensor]:
    """Copies, on the CPU, of the BatchNorm buffers of ``model`` by their
    state-dict names (what a layer on batch statistics drops)."""
    return {f'{name}.{b}' if name else b: buf.detach().cpu().clone()
            for name, m in model.named_modules()
            if isinstance(m, _BatchNorm)
            for b, buf in m.named_buffers(recurse=False) if b in BN_BUFFERS}


def batch_statistics_layers(model: nn.Module) -> List[str]:
    """The BatchNorm layers of ``model`` that normalise with each batch's
    own statistics (no running statistics: ``use_batch_statistics``)."""
    return [name for name, m in model.named_modules()
            if isinstance(m, _BatchNorm) and not m.track_running_stats
            and m.running_mean is None]


def adapted_checkpoint(model: nn.Module,
                       source_buffers: Optional[Dict[str, torch.Tensor]]
                       = None, meta: Optional[dict] = None) -> dict:
    """``{'state_dict', 'meta'}`` of an adapted ``model`` that the strict
    loader reads into the model its config builds: the BatchNorm layers on
    batch statistics get the ``source_buffers`` (:func:`bn_buffers` of the
    model before the method configured it) and are listed in
    ``meta['batch_statistics']``; modules a method added are recorded in
    ``meta['added_modules']`` (``model.added_modules``).

    Raises:
        ValueError: If a layer on batch statistics has no source buffers.
    """
    state = OrderedDict((k, v.detach().cpu().clone())
                        for k, v in model.state_dict().items())
    layers = batch_statistics_layers(model)
    missing = [f'{layer}.{b}' if layer else b for layer in layers
               for b in BN_BUFFERS]
    lacking = [k for k in missing if k not in (source_buffers or {})]
    if lacking:
        raise ValueError(
            f'{len(layers)} BatchNorm layers normalise with batch statistics '
            f'and the source running statistics of {len(lacking)} buffers '
            f'(e.g. {lacking[0]}) were not kept: capture bn_buffers(model) '
            'before the method configures it')
    for key in missing:
        state[key] = source_buffers[key].detach().cpu().clone()
    meta = dict(meta or {})
    if layers:
        meta['batch_statistics'] = layers
    if getattr(model, 'added_modules', None) is not None:
        meta['added_modules'] = dict(model.added_modules)
    return dict(state_dict=state, meta=plain_meta(meta))
