"""Choose STAG's beta0 on the first condition of the first round only.

The paper gives no ACDC beta0/gamma for some methods (CoTTA, EATA, SAR,
DeYO); this runs a ``*-stag.py`` config on round-1 fog alone for each
beta0 of a grid (``tools/test.py``, one process each) and keeps the best
mIoU (ties: the smaller beta0), as ``make demo`` does on its stand-in::

    python tools/select_beta.py configs/stag_acdc/<method>-stag.py CKPT \\
        --beta-grid 50 250 500 1000 --work-dir work_dirs/beta_<method> \\
        [--cfg-options test_dataloader.dataset.data_root=data/acdc ...]

Writes ``<work-dir>/beta_selection.json`` and prints the option to use.
"""
import argparse
import json
import os.path as osp
import subprocess
import sys

from mmengine.config import Config, DictAction

REPO = osp.dirname(osp.dirname(osp.abspath(__file__)))


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description='beta0 of STAG chosen on round-1 of the first condition')
    parser.add_argument('config', help='a *-stag.py online-adaptation config')
    parser.add_argument('checkpoint', help='checkpoint file')
    parser.add_argument('--beta-grid', type=float, nargs='+',
                        default=[50.0, 250.0, 500.0, 1000.0],
                        help='beta0 values to try (default: 50 250 500 1000)')
    parser.add_argument('--condition', default='fog',
                        help='the stream\'s first condition (default: fog)')
    parser.add_argument('--work-dir', required=True,
                        help='one sub-folder per beta0 and the choice')
    parser.add_argument('--cfg-options', nargs='+', action=DictAction,
                        default={}, help='passed on to tools/test.py')
    args = parser.parse_args(argv)
    if any(b <= 0 for b in args.beta_grid):
        parser.error(f'--beta-grid values must be > 0, got {args.beta_grid}')
    return args


def check_config(args) -> None:
    """Errors before any run: no such file, no STAG in the config."""
    for name in ('config', 'checkpoint'):
        if not osp.isfile(getattr(args, name)):
            raise SystemExit(f'error: {name} file not found: '
                             f'{getattr(args, name)}')
    cfg = Config.fromfile(args.config)
    cfg.merge_from_dict(args.cfg_options)
    method = cfg.get('test_cfg', {}).get('method', {})
    if not method.get('stag'):
        raise SystemExit(f'error: {args.config} has no test_cfg.method.stag '
                         '(choose beta0 on a *-stag.py config)')


def as_cli(options: dict) -> list:
    """``key=value`` words for ``--cfg-options`` (lists ``[a,b]``, tuples
    ``(a,b)``)."""
    def fmt(v):
        if isinstance(v, (list, tuple)):
            inner = ','.join(str(x) for x in v)
            return f'[{inner}]' if isinstance(v, list) else f'({inner})'
        return str(v)
    return [f'{k}={fmt(v)}' for k, v in options.items()]


def round_one_miou(args, beta0: float) -> float:
    """mIoU of the first stage with this beta0 (one tools/test.py run)."""
    work_dir = osp.join(args.work_dir, f'beta0_{beta0:g}')
    options = dict(args.cfg_options)
    options.update({'test_dataloader.dataset.rounds': 1,
                    'test_dataloader.dataset.conditions': [args.condition],
                    'test_cfg.method.stag.beta0': beta0})
    cmd = [sys.executable, osp.join(REPO, 'tools', 'test.py'), args.config,
           args.checkpoint, '--work-dir', work_dir, '--cfg-options'
           ] + as_cli(options)
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f'error: the run with beta0={beta0:g} failed '
                         f'(log in {work_dir}):\n{proc.stderr[-3000:]}')
    with open(osp.join(work_dir, 'continual_results.json')) as f:
        return json.load(f)['stages'][0]['mIoU']


def main(argv=None):
    args = parse_args(argv)
    check_config(args)
    scores = {}
    for beta0 in args.beta_grid:
        scores[beta0] = round_one_miou(args, beta0)
        print(f'beta0={beta0:g}: round-1 {args.condition} mIoU '
              f'{scores[beta0]:.2f}', flush=True)
    best = max(args.beta_grid, key=lambda b: (scores[b], -b))
    result = dict(config=args.config, checkpoint=args.checkpoint,
                  condition=args.condition, best_beta0=best,
                  round1_mIoU={f'{b:g}': s for b, s in scores.items()})
    path = osp.join(args.work_dir, 'beta_selection.json')
    with open(path, 'w') as f:
        json.dump(result, f, indent=1)
    print(f'chosen beta0 = {best:g} ({path}); run the whole stream with\n'
          f'  --cfg-options test_cfg.method.stag.beta0={best:g}')
    return result


if __name__ == '__main__':
    main()
