"""Train a segmentor with MMSeg's own training loop (MMSeg's tools/train.py
usage)::

    python tools/train.py CONFIG [--work-dir DIR] [--resume] [--amp]
        [--cfg-options k=v ...] [--launcher none]

``tools/publish_checkpoint.py`` makes its checkpoint load with the safe
``weights_only=True`` loader.
"""
import argparse
import os
import os.path as osp

from mmengine.config import Config, DictAction
from mmengine.runner import Runner


def parse_args():
    parser = argparse.ArgumentParser(description='Train a segmentor')
    parser.add_argument('config', help='train config file path')
    parser.add_argument('--work-dir', help='the dir to save logs and models')
    parser.add_argument('--resume', action='store_true',
                        help='resume from the latest checkpoint in work_dir')
    parser.add_argument('--amp', action='store_true',
                        help='enable automatic mixed precision training')
    parser.add_argument('--cfg-options', nargs='+', action=DictAction,
                        help='override settings in the config, key=value')
    parser.add_argument('--launcher',
                        choices=['none', 'pytorch', 'slurm', 'mpi'],
                        default='none', help='job launcher')
    parser.add_argument('--local_rank', '--local-rank', type=int, default=0)
    args = parser.parse_args()
    os.environ.setdefault('LOCAL_RANK', str(args.local_rank))
    return args


def main():
    args = parse_args()
    if not osp.isfile(args.config):
        raise FileNotFoundError(f'config file not found: {args.config}')
    cfg = Config.fromfile(args.config)
    cfg.launcher = args.launcher
    if args.cfg_options is not None:
        cfg.merge_from_dict(args.cfg_options)
    if args.work_dir is not None:
        cfg.work_dir = args.work_dir
    elif cfg.get('work_dir', None) is None:
        cfg.work_dir = osp.join('./work_dirs',
                                osp.splitext(osp.basename(args.config))[0])
    if args.amp:
        cfg.optim_wrapper.type = 'AmpOptimWrapper'
        cfg.optim_wrapper.setdefault('loss_scale', 'dynamic')
    cfg.resume = args.resume
    Runner.from_cfg(cfg).train()


if __name__ == '__main__':
    main()
