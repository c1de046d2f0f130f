"""Choose STAG's beta0 (and gamma) on the stream's first stage only.

The paper chooses STAG's hyper-parameters on the first condition (ACDC:
round-1 fog; classification: the first corruption). This runs a STAG config
on that first stage alone for every (beta0, gamma) of a grid
(``tools/test.py``'s run, in this process) and keeps the best score (mIoU
or accuracy; ties: the smaller beta0, then the smaller gamma). Both demos
use it::

    python tools/select_beta.py CONFIG CKPT --beta-grid 50 250 500 1000 \\
        [--gamma-grid 10 100] --work-dir work_dirs/beta_<method> \\
        [--cfg-options test_dataloader.dataset.data_root=data/acdc ...]

Writes ``<work-dir>/beta_selection.json`` and prints the options to use.
"""
import argparse
import json
import os
import os.path as osp
import sys

from mmengine.config import Config, DictAction

REPO = osp.dirname(osp.dirname(osp.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)


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


def load_config(config, checkpoint: str, cfg_options: dict) -> Config:
    """The config with its options; errors before any run: no such file,
    no STAG in the config."""
    for name, path in (('config', config), ('checkpoint', checkpoint)):
        if isinstance(path, str) and not osp.isfile(path):
            raise SystemExit(f'error: {name} file not found: {path}')
    cfg = config.copy() if isinstance(config, Config) \
        else Config.fromfile(config)
    cfg.merge_from_dict(cfg_options)
    if not cfg.get('test_cfg', {}).get('method', {}).get('stag'):
        raise SystemExit(f'error: {config} has no test_cfg.method.stag '
                         '(choose beta0 on a STAG config)')
    return cfg


def first_stage_options(cfg: Config, condition=None) -> dict:
    """``--cfg-options`` that keep the stream's first stage alone: ACDC's
    first round of one condition, or a classification stream's first
    corruption (the same images in the same order as in the whole
    stream)."""
    dataset = cfg.test_dataloader.dataset
    if 'rounds' in dataset:
        first = condition or list(dataset.get('conditions', ['fog']))[0]
        return {'test_dataloader.dataset.rounds': 1,
                'test_dataloader.dataset.conditions': [first]}
    first = condition or list(dataset.corruptions)[0]
    return {'test_dataloader.dataset.corruptions': [first]}


def as_cli(options: dict) -> list:
    """``key=value`` words for ``--cfg-options`` (lists ``[a,b]``, tuples
    ``(a,b)``)."""
    def fmt(v):
        if isinstance(v, (list, tuple)):
            inner = ','.join(str(x) for x in v)
            return f'[{inner}]' if isinstance(v, list) else f'({inner})'
        return str(v)
    return [f'{k}={fmt(v)}' for k, v in options.items()]


def first_stage_score(cfg: Config, checkpoint: str, work_dir: str) -> float:
    """The first stage's score (mIoU or accuracy) of one run."""
    from mmseg_stag.engine.runs import prepare_config, run_test
    run_test(prepare_config(cfg.copy(), work_dir), checkpoint)
    with open(osp.join(work_dir, 'continual_results.json')) as f:
        results = json.load(f)
    return results['stages'][0][results.get('score', 'mIoU')]


def select(config, checkpoint: str, beta_grid, work_dir: str,
           gamma_grid=None, cfg_options=None, condition=None,
           log=print) -> dict:
    """Run the grid on the first stage; returns ``dict(beta0, gamma,
    trials=[dict(beta0, gamma, score)])`` and writes it to
    ``<work_dir>/beta_selection.json``."""
    cfg = load_config(config, checkpoint, dict(cfg_options or {}))
    cfg.merge_from_dict(first_stage_options(cfg, condition))
    os.makedirs(work_dir, exist_ok=True)
    gammas = gamma_grid or [cfg.test_cfg.method.stag.gamma]
    trials = []
    for beta0 in beta_grid:
        for gamma in gammas:
            trial = cfg.copy()
            trial.merge_from_dict({'test_cfg.method.stag.beta0': beta0,
                                   'test_cfg.method.stag.gamma': gamma})
            score = first_stage_score(
                trial, checkpoint,
                osp.join(work_dir, f'beta0_{beta0:g}_gamma_{gamma:g}'))
            trials.append(dict(beta0=beta0, gamma=gamma, score=score))
            if log:
                log(f'beta0={beta0:g}, gamma={gamma:g}: first-stage score '
                    f'{score:.2f}')
    best = max(trials, key=lambda t: (t['score'], -t['beta0'], -t['gamma']))
    result = dict(config=config if isinstance(config, str) else None,
                  checkpoint=checkpoint, beta0=best['beta0'],
                  gamma=best['gamma'], trials=trials)
    with open(osp.join(work_dir, 'beta_selection.json'), 'w') as f:
        json.dump(result, f, indent=1)
    return result


def main(argv=None):
    args = parse_args(argv)
    result = select(args.config, args.checkpoint, args.beta_grid,
                    args.work_dir, args.gamma_grid, args.cfg_options,
                    args.condition)
    print(f'chosen beta0 = {result["beta0"]:g}, gamma = {result["gamma"]:g} '
          f'({osp.join(args.work_dir, "beta_selection.json")}); run the '
          'whole stream with\n  --cfg-options '
          f'test_cfg.method.stag.beta0={result["beta0"]:g} '
          f'test_cfg.method.stag.gamma={result["gamma"]:g}')
    return result


if __name__ == '__main__':
    main()
