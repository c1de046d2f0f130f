"""Figure hp_sensitivity: STAG's score over a grid of beta0 and gamma.

    python tools/analysis/hp_sensitivity.py STAG_CONFIG CHECKPOINT \\
        --beta-grid 50 250 500 1000 2000 --gamma-grid 5 10 35 100 \\
        [--optimum 500 35] [--condition gaussian_noise] [--whole-stream] \\
        [--work-dir work_dirs/analysis/hp_sensitivity] [--num-cpus N] \\
        [--address HOST:PORT] [--cfg-options ...]

The grid runs through ``tools/sweep.py`` (Ray: local, or the cluster at
``--address``), on the stream's first stage unless ``--whole-stream``;
the baseline (the config without STAG) runs once in this process. Writes
``hp_sensitivity.png``: (a) the score over ``beta0 / beta*`` at ``gamma*``,
(b) over ``gamma / gamma*`` at ``beta*`` (``--optimum``; default: the
config's), (c) the ``beta0 x gamma`` heatmap, (d) the schedule
``beta_t / beta0 = exp(-t / gamma)``, each with the baseline's score; and
the numbers as ``hp_sensitivity.{json,csv}``.
"""
import argparse
import copy
import json
import os.path as osp
import subprocess
import sys

from mmengine.config import DictAction

from mmseg_stag.engine.runs import run_cached
from mmseg_stag.paper.protocol import as_cli, first_stage_cfg_options

# benchmarks/ (what these commands share) is the repository's, not an
# installed package's: the repository's root on the path
REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

from benchmarks.rows import (check_files, mean_score, pyplot, require_stag,
                             save_figure, stage_config, write_numbers)

NAME = 'hp_sensitivity'
SWEEP = osp.join(osp.dirname(osp.dirname(osp.abspath(__file__))), 'sweep.py')
BETA, GAMMA = 'test_cfg.method.stag.beta0', 'test_cfg.method.stag.gamma'


def parse_args(argv=None):
    p = argparse.ArgumentParser(description='STAG beta0/gamma sensitivity '
                                '(Figure hp_sensitivity)')
    p.add_argument('config', help='a -stag config')
    p.add_argument('checkpoint')
    p.add_argument('--beta-grid', type=float, nargs='+', required=True)
    p.add_argument('--gamma-grid', type=float, nargs='+', required=True)
    p.add_argument('--optimum', type=float, nargs=2, default=None,
                   metavar=('BETA0', 'GAMMA'),
                   help='beta* and gamma* (default: the config\'s)')
    p.add_argument('--condition', default=None)
    p.add_argument('--whole-stream', action='store_true')
    p.add_argument('--work-dir', default='work_dirs/analysis/hp_sensitivity')
    p.add_argument('--num-cpus', type=int, default=None,
                   help='of a local Ray instance')
    p.add_argument('--address', default=None, help='a running Ray cluster')
    p.add_argument('--cfg-options', nargs='+', action=DictAction,
                   default={})
    args = p.parse_args(argv)
    check_files(p, [('config', args.config),
                    ('checkpoint', args.checkpoint)])
    for name in ('beta_grid', 'gamma_grid'):
        if any(v <= 0 for v in getattr(args, name)):
            p.error(f'--{name.replace("_", "-")} values must be > 0')
    return args


def stream_options(args):
    """The config (with ``--cfg-options``), and the options that restrict
    it to its first stage (none with ``--whole-stream``)."""
    cfg = stage_config(args.config, args.cfg_options, whole_stream=True)
    require_stag(cfg, args.config)
    first = {} if args.whole_stream else first_stage_cfg_options(
        cfg, args.condition)
    return cfg, first


def run_grid(args, first):
    """The beta0 x gamma grid through tools/sweep.py (its command, in a
    process of its own); returns ``{(beta0, gamma): score}``."""
    work = osp.join(args.work_dir, 'sweep')
    argv = ['--work-dir', work, '--run', args.config, args.checkpoint,
            '--grid', f'{BETA}=' + ','.join(f'{b:g}' for b in args.beta_grid),
            f'{GAMMA}=' + ','.join(f'{g:g}' for g in args.gamma_grid)]
    options = as_cli(dict(args.cfg_options, **first))
    if options:
        argv += ['--cfg-options', *options]
    if args.num_cpus:
        argv += ['--num-cpus', str(args.num_cpus)]
    if args.address:
        argv += ['--address', args.address]
    done = subprocess.run([sys.executable, SWEEP, *argv])
    if done.returncode:  # the sweep has said why
        raise SystemExit(done.returncode)
    with open(osp.join(work, 'sweep_results.json')) as f:
        rows = json.load(f)['runs']
    scores = {}
    for row in rows:
        mean = next((k for k in row if k.endswith('_mean_over_stages')
                     and row[k] is not None), None)
        if not row.get('stages_done') or mean is None:
            raise RuntimeError(f'sweep run {row["name"]} has no finished '
                               f'stage ({row["status"]}); see {work}')
        scores[(float(row[BETA]), float(row[GAMMA]))] = float(row[mean])
    return scores


def run_baseline(args, cfg, first):
    base = copy.deepcopy(cfg)
    base.merge_from_dict(first)
    base.test_cfg.method.pop('stag')
    res = run_cached(base, args.checkpoint,
                     osp.join(args.work_dir, 'baseline'))
    return (*mean_score(res), res)


def plot(path, grid, betas, gammas, optimum, baseline, key, steps):
    import numpy as np
    b_star, g_star = optimum
    fig, axes = pyplot().subplots(1, 4, figsize=(17, 3.8))
    panels = ((axes[0], [b / b_star for b in betas],
               [grid[(b, g_star)] for b in betas], 'beta0 / beta*',
               f'(a) gamma = {g_star:g}'),
              (axes[1], [g / g_star for g in gammas],
               [grid[(b_star, g)] for g in gammas], 'gamma / gamma*',
               f'(b) beta0 = {b_star:g}'))
    for ax, xs, ys, xlabel, title in panels:
        ax.plot(xs, ys, 'o-', label='+STAG')
        ax.axhline(baseline, color='0.4', linestyle=':', label='baseline')
        ax.axvline(1.0, color='red', linestyle='--', label='optimum')
        ax.set_xscale('log')
        ax.set_xlabel(xlabel)
        ax.set_ylabel(key)
        ax.set_title(title, fontsize=10)
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
    heat = np.array([[grid[(b, g)] for g in gammas] for b in betas])
    im = axes[2].imshow(heat, origin='lower', aspect='auto', cmap='viridis')
    axes[2].set_xticks(range(len(gammas)), [f'{g:g}' for g in gammas])
    axes[2].set_yticks(range(len(betas)), [f'{b:g}' for b in betas])
    for i in range(len(betas)):
        for j in range(len(gammas)):
            axes[2].text(j, i, f'{heat[i, j]:.1f}', ha='center',
                         va='center', fontsize=7, color='w')
    axes[2].set_xlabel('gamma')
    axes[2].set_ylabel('beta0')
    axes[2].set_title(f'(c) {key} (baseline {baseline:.1f})', fontsize=10)
    fig.colorbar(im, ax=axes[2], fraction=0.046, pad=0.04)
    t = np.arange(steps + 1)
    for g in gammas:
        axes[3].plot(t, np.exp(-t / g), label=f'gamma = {g:g}',
                     linestyle='--' if g == g_star else '-')
    axes[3].set_xlabel('update step t')
    axes[3].set_ylabel('beta_t / beta0')
    axes[3].set_title('(d) exp(-t / gamma)', fontsize=10)
    axes[3].legend(fontsize=8)
    axes[3].grid(alpha=0.3)
    save_figure(fig, path)


def main(argv=None):
    args = parse_args(argv)
    cfg, first = stream_options(args)
    stag = cfg.test_cfg.method.stag
    optimum = tuple(args.optimum or (float(stag.beta0), float(stag.gamma)))
    betas = sorted(set(args.beta_grid) | {optimum[0]})
    gammas = sorted(set(args.gamma_grid) | {optimum[1]})
    args.beta_grid, args.gamma_grid = betas, gammas
    baseline, key, base_res = run_baseline(args, cfg, first)
    grid = run_grid(args, first)
    steps = int(base_res.get('num_updates') or 0) or max(
        int(s.get('num_images', 1)) for s in base_res['stages'])
    out = write_numbers(
        args.work_dir, NAME,
        dict(score=key, baseline=baseline, optimum=optimum, beta_grid=betas,
             gamma_grid=gammas,
             grid=[dict(beta0=b, gamma=g, score=grid[(b, g)])
                   for b in betas for g in gammas],
             config=args.config, checkpoint=args.checkpoint,
             condition=args.condition, whole_stream=args.whole_stream),
        ['beta0', 'gamma', 'beta0_over_opt', 'gamma_over_opt', key,
         'baseline'],
        [[b, g, b / optimum[0], g / optimum[1], grid[(b, g)], baseline]
         for b in betas for g in gammas])
    plot(out + '.png', grid, betas, gammas, optimum, baseline, key,
         max(steps, 1))
    best = max(grid, key=grid.get)
    print(f'baseline {key} {baseline:.2f}; best +STAG {grid[best]:.2f} at '
          f'beta0={best[0]:g}, gamma={best[1]:g}; wrote {out}.png, .json, '
          '.csv')
    return dict(grid=grid, baseline=baseline, optimum=optimum)


if __name__ == '__main__':
    main()
