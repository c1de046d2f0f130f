"""Warm up EcoTTA's meta networks on the source training set, before the
stream (EcoTTA without it is not EcoTTA: its meta BNs start far from the
identity).

    python tools/ecotta_warmup.py CONFIG SOURCE_CKPT --train-data PATH \\
        --out WARM.pth [--epochs 10] [--lr 0.05] [--batch-size 64] \\
        [--seed 0] [--work-dir DIR] [--resume] [--device cuda|cpu|cuda:N]
    python tools/test.py CONFIG WARM.pth

``--device``: where the meta networks train; by default where
``tools/test.py`` runs the model (CUDA where torch sees a GPU, else the
CPU). A device this machine lacks is refused before any work.

The state is saved per epoch in ``--work-dir`` (``--resume`` continues);
WARM.pth loads with ``weights_only=True``. Inputs and the training recipe:
docs/classification.md; the warm-up is
:func:`mmseg_stag.classification.ecotta_warmup.warm_up_checkpoint`.
"""
import argparse
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
    p.add_argument('--device', default=None,
                   help="the device of the warm-up: 'cpu', 'cuda', "
                   "'cuda:N' (default: where tools/test.py runs the model: "
                   'CUDA where torch sees a GPU, else the CPU)')
    p.add_argument('--cfg-options', nargs='+', action=DictAction,
                   default={}, help='override config settings')
    args = p.parse_args(argv)
    for name in ('config', 'checkpoint'):
        if not osp.isfile(getattr(args, name)):
            p.error(f'{name} file not found: {getattr(args, name)}')
    if args.epochs < 1 or args.batch_size < 1 or args.lr <= 0:
        p.error('--epochs and --batch-size must be >= 1 and --lr > 0')
    from mmseg_stag.classification.ecotta_warmup import warmup_device
    try:  # before any work
        args.device = str(warmup_device(args.device))
    except ValueError as err:
        p.error(f'--device: {err}')
    if args.work_dir is None:
        stem = osp.splitext(osp.basename(args.out))[0]
        args.work_dir = osp.join('work_dirs', 'ecotta_warmup', stem)
    return args


def main(argv=None):
    args = parse_args(argv)
    from mmseg_stag.classification.ecotta_warmup import warm_up_checkpoint
    return warm_up_checkpoint(
        args.config, args.checkpoint, args.out, args.train_data,
        args.work_dir, train_labels=args.train_labels, epochs=args.epochs,
        lr=args.lr, batch_size=args.batch_size, seed=args.seed,
        limit=args.limit, resume=args.resume,
        trust_pickle=args.trust_pickle, cfg_options=args.cfg_options,
        device=args.device)


if __name__ == '__main__':
    main()
