"""The offline demo: continual "Cityscapes -> ACDC" on a built-in stand-in.

    python tools/demo.py [--work-dir work_dirs/demo] [--rounds 10]
        [--methods source bn-adapt bn-adapt-stag tent tent-stag hybrid-tta
                   hybrid-tta-stag] [--realtime [pinned|measure]]
        [--cfg-options KEY=VALUE ...]

Writes the stand-in data, trains the source model, chooses each +STAG
method's beta0 on round-1 fog, runs every method through ``tools/test.py``
and writes the tables and the comparison figure; a step whose result is in
the work dir is skipped. ``--realtime`` runs every method again under the
realistic protocol (docs/realtime.md), with the step costs pinned in
``configs/demo/*_realtime.py`` (``pinned``) or timed on this machine
(``measure``), and tables it beside the offline runs. Steps, outputs and
results: docs/demo.md.
"""
import argparse
import glob
import json
import os.path as osp
import shutil
import subprocess
import sys
import time

REPO = osp.dirname(osp.dirname(osp.abspath(__file__)))
TRAIN_CFG = 'configs/demo/segformer_mit-tiny_synthetic-cityscapes_train.py'
TEST_CFG = 'configs/demo/segformer_mit-tiny_demo-acdc_{}.py'
#: the same with its step's cost pinned (the realistic protocol)
REALTIME_CFG = 'configs/demo/segformer_mit-tiny_demo-acdc_{}_realtime.py'
#: --realtime measure: timed calls of the step and the forward (the median)
MEASURE = ('test_cfg.realtime.warmup=3', 'test_cfg.realtime.repeats=21')
METHODS = ('source', 'bn-adapt', 'bn-adapt-stag', 'tent', 'tent-stag')
#: beyond the paper, on request (make demo-hybrid): twice a TENT row's time
EXTRA_METHODS = ('hybrid-tta', 'hybrid-tta-stag')
BETA_GRID = (50.0, 250.0, 1000.0)


def run(cmd, quiet=False):
    """Run a project tool with this interpreter; stream its output."""
    cmd = [sys.executable] + [str(c) for c in cmd]
    print('$ ' + ' '.join(osp.relpath(c, REPO) if osp.isabs(c) else c
                          for c in cmd[1:]), flush=True)
    proc = subprocess.run(cmd, cwd=REPO, text=True,
                          stdout=subprocess.PIPE if quiet else None,
                          stderr=subprocess.STDOUT if quiet else None)
    if proc.returncode != 0:
        if quiet:
            print(proc.stdout[-5000:])
        raise SystemExit(f'command failed ({proc.returncode}): '
                         + ' '.join(cmd))


def train_source(args, data_root):
    ckpt = osp.join(args.work_dir, 'source_model.pth')
    if osp.isfile(ckpt):
        print(f'[2/5] source model cached: {ckpt}')
        return ckpt
    print('[2/5] training the source model on the clean scenes')
    train_dir = osp.join(args.work_dir, 'source_train')
    opts = [f'train_dataloader.dataset.data_root={data_root}/cityscapes',
            f'val_dataloader.dataset.data_root={data_root}/cityscapes',
            f'test_dataloader.dataset.data_root={data_root}/cityscapes']
    if args.train_iters:
        opts += [f'train_cfg.max_iters={args.train_iters}',
                 f'train_cfg.val_interval={args.train_iters}',
                 f'default_hooks.checkpoint.interval={args.train_iters}',
                 f'param_scheduler.1.end={args.train_iters}',
                 'param_scheduler.0.end=1',
                 'param_scheduler.1.begin=1',
                 'train_dataloader.num_workers=0',
                 'train_dataloader.persistent_workers=False',
                 'train_dataloader.batch_size=2']
    run(['tools/train.py', TRAIN_CFG, '--work-dir', train_dir,
         '--cfg-options'] + opts)
    with open(osp.join(train_dir, 'last_checkpoint')) as f:
        last = f.read().strip()
    # the checkpoint was written by the training run just above
    run(['tools/publish_checkpoint.py', last, ckpt, '--trust-pickle'])
    return ckpt


def test_options(args, method, data_root, rounds):
    opts = [f'test_dataloader.dataset.data_root={data_root}/acdc',
            f'test_dataloader.dataset.rounds={rounds}',
            f'default_hooks.logger.interval={args.log_interval}']
    if method not in ('source', 'bn-adapt'):  # the ones with an optimizer
        from mmengine.config import Config
        method_cfg = Config.fromfile(
            osp.join(REPO, TEST_CFG.format(method))).test_cfg.method
        if method_cfg.get('optimizer') is None:
            # BN Adapt+STAG updates with the method's default optimizer,
            # Adam (torch's betas), which its config does not spell
            opts.append('test_cfg.method.optimizer.type=Adam')
        opts.append(f'test_cfg.method.optimizer.lr={args.lr}')
    return opts + args.cfg_options


def evaluate(args, method, ckpt, data_root, work_dir, extra):
    """The whole stream, painting the last round's maps in work_dir."""
    from mmseg_stag.engine.report import read_results
    shutil.rmtree(osp.join(work_dir, 'segmaps'), ignore_errors=True)
    # the last image of each condition (painting costs 4x a step)
    opts = test_options(args, method, data_root, args.rounds) + extra + [
        f'default_hooks.visualization.interval={args.per_condition}']
    run(['tools/test.py', TEST_CFG.format(method), ckpt, '--work-dir',
         work_dir, '--show-dir', osp.join(work_dir, 'segmaps'),
         '--cfg-options'] + opts)
    return read_results(work_dir)


def evaluate_realtime(args, method, ckpt, data_root, work_dir, extra):
    """The whole stream under the realistic protocol: the pinned cost's
    config, or the plain one with the cost measured (no maps painted)."""
    from mmseg_stag.engine.report import read_results
    if args.realtime == 'pinned':
        cmd = ['tools/test.py', REALTIME_CFG.format(method), ckpt]
        opts = []
    else:
        cmd = ['tools/test.py', TEST_CFG.format(method), ckpt,
               '--realtime', 'measure']
        opts = list(MEASURE)
    opts += test_options(args, method, data_root, args.rounds) + extra
    run(cmd + ['--work-dir', work_dir, '--cfg-options'] + opts)
    return read_results(work_dir)


def check_realtime_configs(args) -> None:
    """``--realtime pinned``: every method has its pinned cost's config
    (``SystemExit`` naming the missing ones, before any work)."""
    if args.realtime != 'pinned':
        return
    missing = [REALTIME_CFG.format(m) for m in args.methods
               if not osp.isfile(osp.join(REPO, REALTIME_CFG.format(m)))]
    if missing:
        raise SystemExit('error: --realtime pinned: no pinned cost for '
                         f'{", ".join(missing)}; run --realtime measure')


def summarise_realtime(results, realistic, betas, path_json, path_md):
    """The offline and the realistic mean mIoU side by side, with each
    method's cost and the share of batches it adapted on."""
    lines = ['| method | step cost (forwards) | batches adapted | offline '
             'mIoU | realistic mIoU | change |', '|---' * 6 + '|']
    rows = {}
    for method, res in realistic.items():
        info = res['realtime']
        share = info['batches_adapted'] / (
            info['batches_adapted'] + info['batches_predicted_only'])
        offline = results[method]['mean_over_stages']
        rows[method] = dict(realtime=info, share_adapted=share,
                            offline=offline,
                            realistic=res['mean_over_stages'])
        lines.append(
            f"| {label(method, betas)} | {info['cost']:.2f} "
            f"({info['how']}) | {100 * share:.0f} % | {offline:.1f} | "
            f"{res['mean_over_stages']:.1f} | "
            f"{res['mean_over_stages'] - offline:+.1f} |")
    table = '\n'.join(lines)
    with open(path_md, 'w') as f:
        f.write('Continual stand-in benchmark, offline and realistic '
                '(mIoU %, mean over stages; docs/realtime.md)\n\n'
                f'{table}\n')
    from mmseg_stag.engine.report import write_json
    write_json(path_json, dict(methods=rows, betas=betas))
    return table


def select_beta(args, method, ckpt, data_root):
    """beta0 with the best mIoU on the first condition of the first round."""
    cache = osp.join(args.work_dir, 'beta_selection.json')
    chosen = {}
    if osp.isfile(cache):
        with open(cache) as f:
            chosen = json.load(f)
    if method in chosen:
        return chosen[method]['beta0']
    # the one selection tool of both demos: each beta0 on round-1 fog alone
    work_dir = osp.join(args.work_dir, 'beta_selection', method)
    run(['tools/select_beta.py', TEST_CFG.format(method), ckpt,
         '--beta-grid'] + [f'{b:g}' for b in args.beta_grid] +
        ['--condition', 'fog', '--work-dir', work_dir, '--cfg-options'] +
        test_options(args, method, data_root, 1), quiet=True)
    with open(osp.join(work_dir, 'beta_selection.json')) as f:
        trials = json.load(f)['trials']
    scores = {t['beta0']: t['score'] for t in trials}
    for beta0, score in scores.items():
        print(f'      {method}: beta0={beta0:g} -> round-1 fog mIoU '
              f'{score:.2f}')
    best = max(args.beta_grid, key=lambda b: (scores[b], -b))
    chosen[method] = dict(beta0=best, fog_round1_mIoU=scores)
    from mmseg_stag.engine.report import write_json
    write_json(cache, chosen)
    return best


def label(method, betas):
    """The method's name with its chosen beta0, if any."""
    return method + (f' (beta0={betas[method]:g})' if method in betas
                     else '')


def mean_score(stages, key, value):
    """The mean score of the stages whose ``key`` is ``value``."""
    vals = [s['score'] for s in stages if s[key] == value]
    return sum(vals) / len(vals)


def summarise(results, betas, seconds, path_json, path_md):
    conditions = results[next(iter(results))]['conditions']
    rounds = sorted({s['round'] for r in results.values()
                     for s in r['stages']})
    lines = ['| method | ' + ' | '.join(f'round {r}' for r in rounds) +
             ' | mean mIoU |', '|---' * (len(rounds) + 2) + '|']
    for method, res in results.items():
        lines.append(f'| {label(method, betas)} | ' + ' | '.join(
            f"{mean_score(res['stages'], 'round', r):.1f}" for r in rounds)
            + f" | **{res['mean_over_stages']:.1f}** |")
    lines += ['', '| method | ' + ' | '.join(conditions) + ' |',
              '|---' * (len(conditions) + 1) + '|']
    for method, res in results.items():
        lines.append(f'| {method} | ' + ' | '.join(
            f"{mean_score(res['stages'], 'condition', c):.1f}"
            for c in conditions) + ' |')
    table = '\n'.join(lines)
    with open(path_md, 'w') as f:
        f.write('Continual stand-in benchmark (mIoU %, mean over stages); '
                f'total time {seconds / 60:.1f} min\n\n{table}\n')
    from mmseg_stag.engine.report import write_json
    write_json(path_json, dict(
        methods={m: dict(mIoU_mean_over_stages=r['mean_over_stages'],
                         stages=r['stages']) for m, r in results.items()},
        betas=betas, seconds=seconds))
    return table


def compare(results, betas, work_dir):
    """All methods in one figure and table (the paper's Figure
    continual_graph): ``demo_comparison.{png,csv,json,md}``."""
    from mmseg_stag.engine.comparison import write_comparison
    runs = [dict(name=label(method, betas), stages=res['stages'])
            for method, res in results.items()]
    return write_comparison(work_dir, runs, prefix='demo_comparison',
                            title='make demo: mIoU per condition across '
                            'rounds')['png']


def main():
    parser = argparse.ArgumentParser(
        description='Offline continual adaptation demo on a built-in '
        'stand-in for Cityscapes -> ACDC')
    parser.add_argument('--work-dir', default='work_dirs/demo')
    parser.add_argument('--rounds', type=int, default=10)
    parser.add_argument('--methods', nargs='+', default=list(METHODS),
                        choices=METHODS + EXTRA_METHODS)
    parser.add_argument('--lr', type=float, default=1e-4,
                        help='Adam lr of the adapting methods (the demo has '
                        '400 instead of 16,000 steps; the real configs use '
                        '7.5e-6)')
    parser.add_argument('--size', type=int, nargs=2, default=(256, 128),
                        metavar=('W', 'H'))
    parser.add_argument('--train-images', type=int, default=240)
    parser.add_argument('--per-condition', type=int, default=10)
    parser.add_argument('--train-iters', type=int, default=None,
                        help='override the source training length (tests)')
    parser.add_argument('--beta-grid', type=float, nargs='+',
                        default=list(BETA_GRID),
                        help='beta0 values tried on round 1 / fog')
    parser.add_argument('--log-interval', type=int, default=50)
    parser.add_argument('--seed', type=int, default=0)
    parser.add_argument('--realtime', nargs='?', const='pinned',
                        choices=('pinned', 'measure'),
                        help='run every method again under the realistic '
                        'protocol (docs/realtime.md) and table it beside '
                        'the offline runs: the step costs pinned in '
                        'configs/demo/*_realtime.py (pinned, the default), '
                        'or timed on this machine (measure)')
    parser.add_argument('--cfg-options', nargs='+', default=[],
                        metavar='KEY=VALUE',
                        help="settings of every method's runs (e.g. "
                        'model.backbone.type=SDPAMixVisionTransformer: the '
                        "fast preset's attention, docs/demo.md)")
    parser.add_argument('--native-kernels', action='store_true',
                        help="this processor's fastest kernel paths and "
                        'threads instead of the pinned ones: faster, but '
                        "the numbers are this machine's own, not the "
                        "README's (demo_data/kernel_paths.py)")
    args = parser.parse_args()
    # before NumPy or torch loads, here and in every run it starts
    sys.path.insert(0, REPO)
    from demo_data.kernel_paths import pin_or_reexec
    pin_or_reexec(native=args.native_kernels)
    args.work_dir = osp.abspath(args.work_dir)
    check_realtime_configs(args)
    start = time.time()

    from demo_data import make_demo_benchmark
    data_root = osp.join(args.work_dir, 'data')
    print(f'[1/5] demo data in {data_root}')
    make_demo_benchmark(data_root, tuple(args.size), args.train_images,
                        max(2, args.train_images // 15), args.per_condition,
                        args.seed)
    ckpt = train_source(args, data_root)

    betas = {}
    for method in args.methods:
        if method.endswith('stag'):
            print(f'[3/5] choosing beta0 for {method} on round 1 / fog only')
            betas[method] = select_beta(args, method, ckpt, data_root)

    results = {}
    for method in args.methods:
        print(f'[4/5] {method}: {args.rounds} rounds x '
              f'{len(glob.glob(osp.join(data_root, "acdc/rgb_anon/*")))} '
              'conditions', flush=True)
        extra = [f'test_cfg.method.stag.beta0={betas[method]}'] \
            if method in betas else []
        results[method] = evaluate(args, method, ckpt, data_root,
                                   osp.join(args.work_dir, method), extra)

    seconds = time.time() - start
    table = summarise(results, betas, seconds,
                      osp.join(args.work_dir, 'demo_summary.json'),
                      osp.join(args.work_dir, 'demo_summary.md'))
    figure = compare(results, betas, args.work_dir)
    print('\n[5/5] continual stand-in benchmark, mIoU (%) per round and mean '
          'over stages:\n' + table + f'\n\ncomparison figure: {figure}')
    print(f'\nper-method tables, JSON/CSV/PNG and last-round segmentation '
          f'maps: {args.work_dir}/<method>/; total {seconds / 60:.1f} min')
    if args.realtime:
        realistic = {}
        for method in args.methods:
            print(f'[realtime] {method}: the stream does not wait '
                  f'({args.realtime} cost)', flush=True)
            extra = [f'test_cfg.method.stag.beta0={betas[method]}'] \
                if method in betas else []
            realistic[method] = evaluate_realtime(
                args, method, ckpt, data_root,
                osp.join(args.work_dir, 'realtime', method), extra)
        table = summarise_realtime(
            results, realistic, betas,
            osp.join(args.work_dir, 'demo_realtime.json'),
            osp.join(args.work_dir, 'demo_realtime.md'))
        print('\n[realtime] offline and realistic, mIoU (%) mean over '
              'stages:\n' + table)


if __name__ == '__main__':
    main()
