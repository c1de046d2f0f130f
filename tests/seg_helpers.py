"""Helpers shared by the segmentation tests: the real STAG configs shrunk
to a tiny model and tiny data by ``--cfg-options``, tiny MMSeg segmentors
built directly, plain checkpoints.

A module of its own (``tests`` is on ``pythonpath``) rather than
``from conftest import ...``: with several ``conftest.py`` files in the
tree (``tests/classification/conftest.py``), the module named ``conftest``
is whichever pytest loaded last. ``tests/conftest.py`` re-exports these
names and holds the fixtures (``tiny_acdc``, ``tiny_checkpoint``)."""
import copy
import os.path as osp

import torch

#: ``--cfg-options`` words for a dict of options
from mmseg_stag.paper.protocol import as_cli  # noqa: F401

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


def eata_source_options(cityscapes_root):
    """``--cfg-options`` pointing EATA's clean source images (its Fisher
    information) at the tiny Cityscapes-layout folder."""
    prefix = 'test_cfg.source_dataloader.'
    return {prefix + 'dataset.data_root': cityscapes_root,
            prefix + 'num_workers': 0,
            prefix + 'dataset.pipeline.1.scale': (64, 32)}


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


def save_checkpoint(model, path):
    """A plain ``{'state_dict', 'meta'}`` checkpoint, loadable with
    ``torch.load(weights_only=True)`` (ours and MMEngine's loader)."""
    torch.save({'state_dict': model.state_dict(), 'meta': {'seed': 0}}, path)
    return str(path)


def make_runner(method, data_root, checkpoint, work_dir, config=SEG_CFG,
                extra=None, rounds=1):
    """MMEngine's ``Runner`` of a real STAG config (``config.format(
    method)``) shrunk to the tiny model and data, with the checkpoint."""
    import uuid

    from mmengine.config import Config
    from mmengine.runner import Runner

    from mmseg_stag.checkpoint import load_segmentor_checkpoint
    cfg = Config.fromfile(osp.join(REPO, config.format(method)))
    opts = tiny_options(data_root, rounds=rounds,
                        head='nvlabs' if 'nvlabs' in config else 'mmseg')
    opts.update(extra or {})
    cfg.merge_from_dict(opts)
    cfg.work_dir = str(work_dir)
    cfg.experiment_name = f'test_{uuid.uuid4().hex[:8]}'
    runner = Runner.from_cfg(cfg)
    load_segmentor_checkpoint(runner.model, checkpoint)
    return runner


def fresh_model(config, method, tiny_acdc, checkpoint, device, extra=None):
    """The config's model with the checkpoint's weights, unadapted, on the
    device the runner used."""
    from mmseg_stag.checkpoint import load_segmentor_checkpoint
    opts = dict(tiny_options(tiny_acdc), **(extra or {}))
    model, cfg = build_from_config(config.format(method), opts)
    load_segmentor_checkpoint(model, checkpoint)
    return model.to(device).eval(), cfg


def python_path(*dirs):
    """``dirs`` before the inherited ``PYTHONPATH``: a child process finds
    the test hooks and still the packages the parent found there (an
    install with ``pip --target``, as on a GPU machine without network)."""
    import os
    inherited = os.environ.get('PYTHONPATH')
    return os.pathsep.join(list(dirs) + ([inherited] if inherited else []))


def run_script(cmd, cwd, timeout=300, **env):
    """Run a script on the CPU with one thread: fast on a shared machine,
    and two runs of the same stream give the same numbers."""
    import os

    import tool_runs
    env = dict(os.environ, OMP_NUM_THREADS='1', CUDA_VISIBLE_DEVICES='',
               **env)
    return tool_runs.run(cmd, capture_output=True, text=True, cwd=cwd,
                          env=env, timeout=timeout)


def mmseg_test_py():
    """MMSeg's own packaged ``tools/test.py``."""
    import mmseg
    return osp.join(osp.dirname(mmseg.__file__), '.mim', 'tools', 'test.py')


def free_port():
    """A free local TCP port (torchrun's rendezvous)."""
    import socket
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]
