"""Convert NVlabs SegFormer checkpoints to ``TTAEncoderDecoder`` +
``MixVisionTransformer`` + ``NVSegformerHead`` (MMSeg 1.x) state dicts.

Backbone keys follow MMSeg's own ``mit2mmseg`` mapping; head keys keep their
names except the classifier, ``linear_pred`` -> ``conv_seg``.
"""
import re
from collections import OrderedDict
from typing import Dict

import torch

from mmseg_stag.checkpoint import extract_state_dict, load_checkpoint_file

_HEAD_KEY = re.compile(r'^(linear_c[1-4]\.proj|linear_fuse\.(conv|bn)|'
                       r'linear_pred)\.')
# keys of NVlabs' training wrappers that carry no model weight
_IGNORED = re.compile(r'^(decode_head\.conv_seg\.|auxiliary_head\.)')


def _convert_backbone_key(key: str, value: torch.Tensor,
                          backbone: Dict[str, torch.Tensor]):
    """One NVlabs MiT entry -> ``(mmseg_key, tensor)``; ``None`` to drop."""
    match = re.match(r'^patch_embed(\d)\.(proj|norm)\.(.+)$', key)
    if match:
        stage, part, rest = match.groups()
        part = 'projection' if part == 'proj' else 'norm'
        return f'layers.{int(stage) - 1}.0.{part}.{rest}', value
    match = re.match(r'^norm(\d)\.(.+)$', key)
    if match:
        stage, rest = match.groups()
        return f'layers.{int(stage) - 1}.2.{rest}', value
    match = re.match(r'^block(\d)\.(\d+)\.(.+)$', key)
    if not match:
        raise KeyError(key)
    stage, index, rest = match.groups()
    prefix = f'layers.{int(stage) - 1}.1.{index}.'
    if rest.startswith('attn.kv.'):
        return None  # merged into in_proj together with attn.q
    if rest.startswith('attn.q.'):
        kv = backbone[f'block{stage}.{index}.attn.kv.{rest[len("attn.q."):]}']
        return (prefix + 'attn.attn.in_proj_' + rest[len('attn.q.'):],
                torch.cat([value, kv], dim=0))
    if rest.startswith('attn.proj.'):
        return prefix + 'attn.attn.out_proj.' + rest[len('attn.proj.'):], \
            value
    if rest.startswith(('attn.sr.', 'attn.norm.', 'norm1.', 'norm2.')):
        return prefix + rest, value
    mlp = re.match(r'^mlp\.(fc1|dwconv\.dwconv|fc2)\.(weight|bias)$', rest)
    if mlp:
        layer, param = mlp.groups()
        index_in_ffn = {'fc1': 0, 'dwconv.dwconv': 1, 'fc2': 4}[layer]
        if layer in ('fc1', 'fc2') and param == 'weight':
            value = value.reshape(*value.shape, 1, 1)  # Linear -> 1x1 conv
        return f'{prefix}ffn.layers.{index_in_ffn}.{param}', value
    raise KeyError(key)


def convert_nvlabs_segformer(state_dict: Dict[str, torch.Tensor]
                             ) -> 'OrderedDict[str, torch.Tensor]':
    """Map an NVlabs SegFormer state dict onto MMSeg 1.x names.

    Raises:
        ValueError: listing every key that is not part of NVlabs' SegFormer.
    """
    backbone = {k[len('backbone.'):]: v for k, v in state_dict.items()
                if k.startswith('backbone.')}
    converted, unknown = OrderedDict(), []
    for key, value in state_dict.items():
        if key.startswith('backbone.'):
            try:
                item = _convert_backbone_key(key[len('backbone.'):], value,
                                             backbone)
            except KeyError:
                unknown.append(key)
                continue
            if item is not None:
                converted['backbone.' + item[0]] = item[1]
        elif key.startswith('decode_head.') and _HEAD_KEY.match(
                key[len('decode_head.'):]):
            converted[key.replace('decode_head.linear_pred.',
                                  'decode_head.conv_seg.')] = value
        elif not _IGNORED.match(key):
            unknown.append(key)
    if unknown:
        raise ValueError(
            f'not an NVlabs SegFormer checkpoint: {len(unknown)} unknown '
            f'keys, e.g. {unknown[:8]}')
    return converted


def convert_nvlabs_checkpoint(src: str, dst: str,
                              allow_unsafe_pickle: bool = False) -> int:
    """Read ``src`` safely, convert, and save ``state_dict`` + plain ``meta``
    to ``dst`` (loadable with ``weights_only=True``). Returns the number of
    tensors written."""
    state = extract_state_dict(load_checkpoint_file(src, allow_unsafe_pickle),
                               src)
    converted = convert_nvlabs_segformer(state)
    torch.save({'state_dict': converted,
                'meta': {'converted_from': str(src),
                         'converter': 'mmseg_stag nvlabs_convert'}}, dst)
    return len(converted)
