"""Convert an NVlabs SegFormer checkpoint for the ``*nvlabs*`` configs.

    python tools/convert_nvlabs_segformer.py \
        segformer.b5.1024x1024.city.160k.pth \
        checkpoints/segformer_b5_nvlabs_city.pth

Reads the source with ``torch.load(weights_only=True)`` (``--trust-pickle``
only for a legacy pickle you trust) and writes ``state_dict`` + plain
``meta`` for MMSeg's MiT with NVlabs' LayerNorm eps values
(``NVMixVisionTransformer``) and ``NVSegformerHead``. The key mapping is
this script's, as MMSeg's ``tools/model_converters/mit2mmseg.py`` holds its
own (the backbone's keys as there): :func:`convert_nvlabs_segformer` maps a
state dict, :func:`convert_nvlabs_checkpoint` a file.
"""
import argparse
import os.path as osp
import re
import sys
from collections import OrderedDict
from typing import List, Mapping, Optional, Tuple

import torch

REPO = osp.dirname(osp.dirname(osp.abspath(__file__)))
if REPO not in sys.path:  # the package, not installed in a checkout
    sys.path.insert(0, REPO)

from mmseg_stag.checkpoint import (extract_state_dict, load_checkpoint_file,
                                   plain_meta)
from mmseg_stag.engine.report import write_torch

_PATCH_EMBED = re.compile(r'^patch_embed([1-9])\.(proj|norm)\.(weight|bias)$')
_STAGE_NORM = re.compile(r'^norm([1-9])\.(weight|bias)$')
_BLOCK = re.compile(r'^block([1-9])\.(\d+)\.(.+)$')
_BLOCK_SAME = re.compile(r'^(norm1|norm2|attn\.sr|attn\.norm)\.(weight|bias)$')
_MLP = re.compile(r'^mlp\.(fc1|dwconv\.dwconv|fc2)\.(weight|bias)$')
_FFN_INDEX = {'fc1': 0, 'dwconv.dwconv': 1, 'fc2': 4}
_HEAD_SAME = re.compile(
    r'^decode_head\.(linear_c[1-4]\.proj\.(weight|bias)|linear_fuse\.conv\.'
    r'weight|linear_fuse\.bn\.(weight|bias|running_mean|running_var|'
    r'num_batches_tracked))$')
_HEAD_PRED = re.compile(r'^decode_head\.linear_pred\.(weight|bias)$')
#: keys of NVlabs checkpoints that carry no weight of the model, dropped
DROPPED_KEYS = re.compile(r'^(decode_head\.conv_seg|backbone\.head)\.'
                          r'(weight|bias)$')


class _Unknown(Exception):
    """A key that is not part of an NVlabs SegFormer (internal)."""


def _convert_block_key(stage: int, index: str, rest: str, value: torch.Tensor,
                       backbone: Mapping[str, torch.Tensor]
                       ) -> Optional[Tuple[str, torch.Tensor]]:
    prefix = f'layers.{stage - 1}.1.{index}.'
    if _BLOCK_SAME.match(rest):
        return prefix + rest, value
    match = re.match(r'^attn\.(q|kv|proj)\.(weight|bias)$', rest)
    if match:
        part, param = match.groups()
        if part == 'proj':
            return f'{prefix}attn.attn.out_proj.{param}', value
        q_key = f'block{stage}.{index}.attn.q.{param}'
        kv_key = f'block{stage}.{index}.attn.kv.{param}'
        own, other = (kv_key, q_key) if part == 'kv' else (q_key, kv_key)
        if other not in backbone:
            raise ValueError(f'backbone.{own} has no matching '
                             f'backbone.{other}')
        if part == 'kv':
            return None  # merged with attn.q below
        kv = backbone[kv_key]
        if kv.shape[0] != 2 * value.shape[0] or kv.shape[1:] != \
                value.shape[1:]:
            raise ValueError(
                f'backbone.{kv_key} has shape {tuple(kv.shape)}, expected '
                f'2x backbone.{q_key} {tuple(value.shape)}')
        # in_proj rows are [q; k; v], NVlabs' kv rows are [k; v]
        return f'{prefix}attn.attn.in_proj_{param}', torch.cat([value, kv])
    match = _MLP.match(rest)
    if match:
        layer, param = match.groups()
        if layer in ('fc1', 'fc2') and param == 'weight':
            if value.dim() != 2:
                raise ValueError(f'backbone.block{stage}.{index}.{rest}: '
                                 f'expected a Linear weight, got shape '
                                 f'{tuple(value.shape)}')
            value = value.reshape(*value.shape, 1, 1)  # Linear -> 1x1 conv
        return f'{prefix}ffn.layers.{_FFN_INDEX[layer]}.{param}', value
    raise _Unknown


def _convert_backbone_key(key: str, value: torch.Tensor,
                          backbone: Mapping[str, torch.Tensor]
                          ) -> Optional[Tuple[str, torch.Tensor]]:
    """Return ``(mmseg_key, tensor)`` of one MiT entry, None if merged."""
    match = _PATCH_EMBED.match(key)
    if match:
        stage, part, param = match.groups()
        part = 'projection' if part == 'proj' else 'norm'
        return f'layers.{int(stage) - 1}.0.{part}.{param}', value
    match = _STAGE_NORM.match(key)
    if match:
        stage, param = match.groups()
        return f'layers.{int(stage) - 1}.2.{param}', value
    match = _BLOCK.match(key)
    if match:
        stage, index, rest = match.groups()
        return _convert_block_key(int(stage), index, rest, value, backbone)
    raise _Unknown


def _shown(keys: List[str]) -> str:
    return ', '.join(keys[:20]) + (' ...' if len(keys) > 20 else '')


def _convert(state_dict: Mapping[str, torch.Tensor]
             ) -> Tuple['OrderedDict[str, torch.Tensor]', List[str]]:
    state = OrderedDict(
        (k[len('module.'):] if k.startswith('module.') else k, v)
        for k, v in state_dict.items())
    backbone = {k[len('backbone.'):]: v for k, v in state.items()
                if k.startswith('backbone.')}
    converted: 'OrderedDict[str, torch.Tensor]' = OrderedDict()
    unknown, dropped = [], []
    for key, value in state.items():
        if not isinstance(value, torch.Tensor):
            raise ValueError(f'{key!r} is not a tensor '
                             f'({type(value).__name__}); not a state dict')
        if DROPPED_KEYS.match(key):
            dropped.append(key)
            continue
        try:
            if key.startswith('backbone.'):
                item = _convert_backbone_key(key[len('backbone.'):], value,
                                             backbone)
                if item is not None:
                    converted['backbone.' + item[0]] = item[1]
                continue
            if _HEAD_SAME.match(key):
                converted[key] = value
                continue
            match = _HEAD_PRED.match(key)
            if match:
                converted[f'decode_head.conv_seg.{match.group(1)}'] = value
                continue
            raise _Unknown
        except _Unknown:
            unknown.append(key)
    if unknown:
        hint = ''
        if any(k.startswith('backbone.layers.') for k in unknown):
            hint = (' (keys like backbone.layers.* suggest a checkpoint '
                    'that is already in MMSeg format: load it directly)')
        raise ValueError(
            f'not an NVlabs SegFormer checkpoint: {len(unknown)} unknown '
            f'key(s): {_shown(unknown)}{hint}')
    if 'decode_head.conv_seg.weight' not in converted:
        raise ValueError('not an NVlabs SegFormer checkpoint: no '
                         'decode_head.linear_pred.weight (the classifier)')
    return converted, dropped


def convert_nvlabs_segformer(state_dict: Mapping[str, torch.Tensor]
                             ) -> 'OrderedDict[str, torch.Tensor]':
    """Map an NVlabs SegFormer state dict (a DDP ``module.`` prefix or
    not) onto the keys of an MMSeg ``EncoderDecoder`` with
    ``NVMixVisionTransformer`` and ``NVSegformerHead``.

    Raises:
        ValueError: If a key is unknown or an ``attn.q``/``attn.kv`` pair
            is inconsistent.
    """
    return _convert(state_dict)[0]


def convert_nvlabs_checkpoint(src: str,
                              dst: str,
                              allow_unsafe_pickle: bool = False) -> int:
    """Convert the NVlabs checkpoint file ``src``, save it to ``dst`` (its
    directory created) and return the number of tensors written.

    ``allow_unsafe_pickle``: unpickle arbitrary objects of a trusted
    ``src``.

    Raises:
        RuntimeError: If the safe loader refuses ``src``.
        ValueError: If ``src`` is not an NVlabs SegFormer checkpoint.
    """
    checkpoint = load_checkpoint_file(src, allow_unsafe_pickle)
    converted, dropped = _convert(extract_state_dict(checkpoint, src))
    source = checkpoint.get('meta')  # a dict: extract_state_dict checked
    meta = {
        'converted_from': osp.basename(str(src)),
        'converter': 'tools/convert_nvlabs_segformer.py',
        'format': 'NVlabs SegFormer -> MMSeg 1.x NVMixVisionTransformer + '
        'NVSegformerHead',
        'num_tensors': len(converted),
        'dropped_keys': dropped,
        'source_meta': plain_meta(source) if isinstance(source, dict) else {},
    }
    write_torch(dst, {'state_dict': converted, 'meta': meta})
    return len(converted)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description='Convert an NVlabs SegFormer checkpoint (MiT backbone + '
        'SegFormerHead) to MMSeg 1.x keys (NVMixVisionTransformer + '
        'NVSegformerHead)')
    parser.add_argument('src', help='NVlabs checkpoint (.pth)')
    parser.add_argument('dst', help='output checkpoint (.pth)')
    parser.add_argument(
        '--trust-pickle',
        action='store_true',
        help='allow unsafe unpickling (torch.load weights_only=False) of a '
        'trusted legacy checkpoint that the safe loader refuses')
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    try:
        count = convert_nvlabs_checkpoint(
            args.src, args.dst, allow_unsafe_pickle=args.trust_pickle)
    except (OSError, RuntimeError, ValueError) as err:  # one sentence:
        sys.exit(f'error: {err}')  # a file unreadable or unwritable
    print(f'converted {count} tensors: {args.src} -> {args.dst}')


if __name__ == '__main__':
    main()
