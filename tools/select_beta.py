"""Choose STAG's beta0 (and gamma) on the stream's first stage only, as
the paper does (ACDC: round-1 fog; classification: the first corruption):
every (beta0, gamma) of the grid runs alone on that stage; the best score
wins (ties: the smaller beta0, then gamma). Both demos use it::

    python tools/select_beta.py CONFIG CKPT --beta-grid 50 250 500 1000 \\
        [--gamma-grid 10 100] --work-dir work_dirs/beta_<method> \\
        [--cfg-options test_dataloader.dataset.data_root=data/acdc ...]

Writes ``<work-dir>/beta_selection.json`` and prints the options to use.
The choice itself is :func:`mmseg_stag.paper.protocol.select`.
"""
import argparse
import os.path as osp
import sys

from mmengine.config import DictAction

REPO = osp.dirname(osp.dirname(osp.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

from mmseg_stag.paper.protocol import select


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description='beta0/gamma of STAG chosen on the first stage')
    parser.add_argument('config', help='an online-adaptation config with '
                        'test_cfg.method.stag')
    parser.add_argument('checkpoint', help='checkpoint file')
    parser.add_argument('--beta-grid', type=float, nargs='+',
                        default=[50.0, 250.0, 500.0, 1000.0],
                        help='beta0 values to try (default: 50 250 500 1000)')
    parser.add_argument('--gamma-grid', type=float, nargs='+', default=None,
                        help='gamma values to try (default: the config\'s)')
    parser.add_argument('--condition', default=None,
                        help='the first stage\'s condition (default: the '
                        'stream\'s first: ACDC fog, the first corruption)')
    parser.add_argument('--work-dir', required=True,
                        help='one sub-folder per trial and the choice')
    parser.add_argument('--cfg-options', nargs='+', action=DictAction,
                        default={}, help='as for tools/test.py')
    args = parser.parse_args(argv)
    for name in ('beta_grid', 'gamma_grid'):
        values = getattr(args, name) or []
        if any(v <= 0 for v in values):
            parser.error(f'--{name.replace("_", "-")} values must be > 0, '
                         f'got {values}')
    return args


def main(argv=None):
    args = parse_args(argv)
    try:
        result = select(args.config, args.checkpoint, args.beta_grid,
                        args.work_dir, args.gamma_grid, args.cfg_options,
                        args.condition)
    except (FileNotFoundError, ValueError) as err:
        raise SystemExit(f'error: {err}') from None
    print(f'chosen beta0 = {result["beta0"]:g}, gamma = {result["gamma"]:g} '
          f'({osp.join(args.work_dir, "beta_selection.json")}); run the '
          'whole stream with\n  --cfg-options '
          f'test_cfg.method.stag.beta0={result["beta0"]:g} '
          f'test_cfg.method.stag.gamma={result["gamma"]:g}')
    return result


if __name__ == '__main__':
    main()
