"""Shared fixtures and helpers: a tiny ACDC-layout dataset, a tiny SegFormer
checkpoint matching the real configs shrunk by ``--cfg-options``, and tiny
MMSeg segmentors built directly."""
import copy
import os
import os.path as osp

import pytest
import torch

from demo import make_acdc_like_tree

REPO = osp.dirname(osp.dirname(osp.abspath(__file__)))
#: the real STAG configs (``.format(method)``): MMSeg and NVlabs SegFormer head
SEG_CFG = 'configs/stag_acdc/segformer_mit-b5_acdc-continual_{}.py'
NVLABS_SEG_CFG = ('configs/stag_acdc/'
                  'segformer_mit-b5-nvlabs_acdc-continual_{}.py')
TINY_MIT = dict(embed_dims=8, num_layers=[1, 1, 1, 1], num_heads=[1, 2, 2, 2],
                drop_path_rate=0.0)
TINY_IN_CHANNELS = [8, 16, 16, 16]


def tiny_options(data_root, rounds=2, head='mmseg'):
    """``--cfg-options`` that shrink a real STAG config to the tiny model and
    data (inputs resized to 64x32)."""
    opts = {
        'test_dataloader.dataset.data_root': data_root,
        'test_dataloader.dataset.rounds': rounds,
        'test_dataloader.num_workers': 0,
        'test_dataloader.dataset.pipeline.1.scale': (64, 32),
        'model.decode_head.in_channels': TINY_IN_CHANNELS,
        'model.decode_head.channels': 16,
        'default_hooks.logger.interval': 1,
    }
    opts.update({f'model.backbone.{k}': v for k, v in TINY_MIT.items()})
    if head == 'nvlabs':
        opts['model.decode_head.embedding_dim'] = 16
    return opts


def as_cli(opts):
    def fmt(v):
        if isinstance(v, (list, tuple)):
            inner = ','.join(str(x) for x in v)
            return f'[{inner}]' if isinstance(v, list) else f'({inner})'
        return str(v)
    return [f'{k}={fmt(v)}' for k, v in opts.items()]


def build_from_config(config, opts, seed=0):
    """The model a config builds (with ``opts``), seeded."""
    from mmengine.config import Config
    from mmengine.registry import init_default_scope
    from mmseg.registry import MODELS
    cfg = Config.fromfile(osp.join(REPO, config))
    cfg.merge_from_dict(opts)
    init_default_scope('mmseg')
    torch.manual_seed(seed)
    return MODELS.build(cfg.model), cfg


def mit_backbone(**overrides):
    """A complete ``MixVisionTransformer`` config: the tiny MiT of
    ``TINY_MIT`` (stage widths ``embed_dims * num_heads[i]``) unless
    overridden."""
    cfg = dict(type='MixVisionTransformer', in_channels=3, num_stages=4,
               patch_sizes=[7, 3, 3, 3], sr_ratios=[8, 4, 2, 1],
               out_indices=(0, 1, 2, 3), mlp_ratio=4, qkv_bias=True,
               drop_rate=0.0, attn_drop_rate=0.0, init_cfg=None,
               **copy.deepcopy(TINY_MIT))
    cfg.update(copy.deepcopy(overrides))
    return cfg


def build_segmentor(decode_head, test_cfg=None, backbone=None, seed=0,
                    **kwargs):
    """MMSeg's plain ``EncoderDecoder`` (tiny MiT unless ``backbone`` is
    given) with ``decode_head``, seeded, in eval mode; ``kwargs`` go to the
    segmentor config (e.g. ``auxiliary_head``)."""
    from mmengine.config import ConfigDict
    from mmengine.registry import init_default_scope
    from mmseg.registry import MODELS
    init_default_scope('mmseg')
    torch.manual_seed(seed)
    cfg = ConfigDict(type='EncoderDecoder',
                     backbone=backbone or mit_backbone(),
                     decode_head=copy.deepcopy(decode_head),
                     train_cfg=dict(),
                     test_cfg=dict(test_cfg or dict(mode='whole')),
                     **copy.deepcopy(kwargs))  # as built from a config file
    return MODELS.build(cfg).eval()


@pytest.fixture(autouse=True)
def one_torch_thread_for_segmentation(request):
    """Tests under ``tests/segmentation`` run tiny models: one intra-op
    thread avoids OpenMP oversubscription on a shared machine (an order of
    magnitude faster there); the thread count is restored afterwards."""
    if f'{os.sep}segmentation{os.sep}' not in str(request.path):
        yield
        return
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


@pytest.fixture(scope='session')
def tiny_acdc(tmp_path_factory):
    root = tmp_path_factory.mktemp('acdc')
    return str(make_acdc_like_tree(str(root), images_per_condition=2,
                                   size=(96, 48), seed=0))


def save_checkpoint(model, path):
    """A plain ``{'state_dict', 'meta'}`` checkpoint, loadable with
    ``torch.load(weights_only=True)`` (ours and MMEngine's loader)."""
    torch.save({'state_dict': model.state_dict(), 'meta': {'seed': 0}}, path)
    return str(path)


@pytest.fixture(scope='session')
def tiny_checkpoint(tmp_path_factory, tiny_acdc):
    """A tiny MMSeg-head SegFormer checkpoint (random, seeded) with BN
    statistics that are not the identity."""
    model, _ = build_from_config(SEG_CFG.format('source'),
                                 tiny_options(tiny_acdc))
    bn = model.decode_head.fusion_conv.bn
    bn.running_mean.uniform_(-0.2, 0.2)
    bn.running_var.uniform_(0.5, 1.5)
    path = tmp_path_factory.mktemp('ckpt') / 'tiny_segformer.pth'
    return save_checkpoint(model, path)
