"""Warm up EcoTTA's meta networks on the source training set, before the
stream (EcoTTA without it is not EcoTTA: its meta BNs start far from the
identity).

    python tools/ecotta_warmup.py CONFIG SOURCE_CKPT --train-data PATH \\
        --out WARM.pth [--epochs 10] [--lr 0.05] [--batch-size 64] \\
        [--seed 0] [--work-dir DIR] [--resume]
    python tools/test.py CONFIG WARM.pth

CONFIG is the EcoTTA test config (its model an ``OnlineClassifier`` over
an ``EcoTTANetwork``), SOURCE_CKPT the source network's weights (e.g.
RobustBench's ``Hendrycks2020AugMix_WRN.pt``), PATH CIFAR-10/100's python
folder (``cifar-10-batches-py``, ``cifar-100-python``) or an ``.npy`` of
uint8 HWC images with ``--train-labels``. The state is saved after every
epoch in ``--work-dir``; ``--resume`` continues from it (the same settings
are required). WARM.pth holds ``state_dict`` (the network with its meta
networks) and plain ``meta``: it loads with ``weights_only=True``.
"""
import argparse
import hashlib
import os
import os.path as osp
import sys

REPO = osp.dirname(osp.dirname(osp.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)


def parse_args(argv=None):
    from mmengine.config import DictAction
    p = argparse.ArgumentParser(description='EcoTTA warm-up of the meta '
                                'networks on source data')
    p.add_argument('config', help='the EcoTTA test config')
    p.add_argument('checkpoint', help='the source network weights')
    p.add_argument('--train-data', required=True,
                   help='cifar-10-batches-py / cifar-100-python (or their '
                   'parent), or an .npy of uint8 HWC images')
    p.add_argument('--train-labels', help='labels .npy (with an .npy of '
                   'images)')
    p.add_argument('--out', required=True, help='the warmed-up checkpoint')
    p.add_argument('--epochs', type=int, default=10)
    p.add_argument('--lr', type=float, default=0.05)
    p.add_argument('--batch-size', type=int, default=64)
    p.add_argument('--seed', type=int, default=0)
    p.add_argument('--limit', type=int, default=None,
                   help='use the first N training images only')
    p.add_argument('--work-dir', default=None, help='per-epoch state '
                   '(default: work_dirs/ecotta_warmup/<out name>)')
    p.add_argument('--resume', action='store_true',
                   help='continue from the work dir\'s last epoch')
    p.add_argument('--trust-pickle', action='store_true',
                   help='load a checkpoint that needs unsafe unpickling')
    p.add_argument('--cfg-options', nargs='+', action=DictAction,
                   default={}, help='override config settings')
    args = p.parse_args(argv)
    for name in ('config', 'checkpoint'):
        if not osp.isfile(getattr(args, name)):
            p.error(f'{name} file not found: {getattr(args, name)}')
    if args.epochs < 1 or args.batch_size < 1 or args.lr <= 0:
        p.error('--epochs and --batch-size must be >= 1 and --lr > 0')
    if args.work_dir is None:
        stem = osp.splitext(osp.basename(args.out))[0]
        args.work_dir = osp.join('work_dirs', 'ecotta_warmup', stem)
    return args


def build_model(config, cfg_options):
    """The config's ``OnlineClassifier`` (built in the mmseg_stag scope)."""
    from mmengine.config import Config

    import mmseg_stag  # noqa: F401  (registers the classification parts)
    from mmseg_stag.registry import MODELS
    cfg = Config.fromfile(config)
    cfg.merge_from_dict(cfg_options)
    model_cfg = cfg.get('model')
    if not model_cfg or model_cfg.get('type') != 'OnlineClassifier' or \
            model_cfg['network'].get('type') != 'EcoTTANetwork':
        raise ValueError(f'{config}: the warm-up needs model=dict(type='
                         "'OnlineClassifier', network=dict(type="
                         "'EcoTTANetwork', ...))")
    return MODELS.build(dict(model_cfg, _scope_='mmseg_stag'))


def file_digest(path: str) -> str:
    h = hashlib.sha1()
    with open(path, 'rb') as f:
        for chunk in iter(lambda: f.read(1 << 20), b''):
            h.update(chunk)
    return h.hexdigest()


def main(argv=None):
    args = parse_args(argv)
    import numpy as np
    import torch
    from mmengine.utils import ProgressBar

    from mmseg_stag.classification.ecotta_warmup import (read_training_set,
                                                         source_loss,
                                                         warm_up)
    torch.manual_seed(args.seed)  # the meta networks' initialisation
    model = build_model(args.config, args.cfg_options)
    meta = model.network.ecotta
    cold, meta.allow_cold_start = meta.allow_cold_start, True
    model.load_weights(args.checkpoint, args.trust_pickle)  # frozen part
    meta.allow_cold_start = cold
    images, labels = read_training_set(args.train_data, args.train_labels)
    if args.limit:
        images, labels = images[:args.limit], labels[:args.limit]
    print(f'EcoTTA warm-up: {len(images)} images, {args.epochs} epochs, '
          f'batch {args.batch_size}, lr {args.lr}, meta networks '
          f'{list(meta.blocks_per_part)} -> {args.out}', flush=True)
    settings = dict(config=osp.abspath(args.config),
                    cfg_options=repr(sorted(args.cfg_options.items())),
                    source=file_digest(args.checkpoint),
                    data=hashlib.sha1(np.ascontiguousarray(images)).hexdigest()
                    + hashlib.sha1(np.asarray(labels)).hexdigest())
    before = source_loss(model, images, labels)

    def progress(n):
        bar = ProgressBar(n)  # elapsed and ETA per epoch
        return lambda _: bar.update()

    history = warm_up(model, images, labels, args.work_dir, args.epochs,
                      args.lr, args.batch_size, args.seed, args.resume,
                      settings, progress)
    after = source_loss(model, images, labels)
    for epoch, (loss, acc) in enumerate(zip(history['loss'],
                                            history['acc']), 1):
        print(f'epoch {epoch}: train loss {loss:.4f}, acc {acc:.4f}')
    print(f'source cross-entropy (no augmentation): {before:.4f} before, '
          f'{after:.4f} after the warm-up')
    os.makedirs(osp.dirname(osp.abspath(args.out)), exist_ok=True)
    tmp = args.out + '.tmp'
    torch.save(dict(state_dict=model.network.state_dict(),
                    meta=dict(ecotta_warmup=dict(
                        epochs=args.epochs, lr=args.lr,
                        batch_size=args.batch_size, seed=args.seed,
                        images=len(images), source_loss_before=before,
                        source_loss_after=after,
                        history=history))), tmp)
    os.replace(tmp, args.out)
    print(f'wrote {args.out}; run: python tools/test.py {args.config} '
          f'{args.out}')
    return dict(history=history, before=before, after=after)


if __name__ == '__main__':
    main()
