"""Offline classification demo: adaptation baselines ± STAG on corrupted
MNIST.

    python tools/demo_cls.py [--work-dir work_dirs/demo_cls]
        [--scenarios continual mild label-shift bs1] [--nets bn gn ln]
        [--methods bn_adapt tent eata sar deyo cotta] [--n-test 1000]

Writes the corrupted digits (CIFAR-10-C's layout), trains the source
models, chooses STAG's beta0/gamma per baseline on the first corruption
(``tools/select_beta.py``'s choice) and runs every row of each scenario as
a ``tools/test.py`` run in this process; a step whose result is in the
work dir is reused. Steps, outputs and results: docs/demo.md.
"""
import argparse
import functools
import json
import os
import os.path as osp
import sys
import time

REPO = osp.dirname(osp.dirname(osp.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

DEMO_BASE = osp.join(REPO, 'configs', 'cls', 'demo', '_base_')
CLS_BASE = osp.join(REPO, 'configs', 'cls', '_base_')
#: net: (title, model base under configs/cls/demo/_base_/models)
NETS = {'bn': ('CNN-BN', 'cnn-bn'), 'gn': ('CNN-GN', 'cnn-gn'),
        'ln': ('ViT-LN', 'vit-ln')}
#: scenario: (stream base under configs/cls/demo/_base_/datasets, table
#: metric, baselines, models, the paper's setting whose +STAG rows it
#: keeps: None = every baseline gets one), paired as in the paper's
#: tables (docs/demo.md).
SCENARIOS = {
    'continual': ('mnist-c_continual', 'err',
                  ('bn_adapt', 'tent', 'cotta', 'ecotta'), ('bn', ), None),
    'mild': ('mnist-c_mild', 'acc',
             ('bn_adapt', 'tent', 'eata', 'sar', 'deyo'), ('bn', 'gn', 'ln'),
             None),
    'label-shift': ('mnist-c_label-shift', 'acc',
                    ('tent', 'eata', 'sar', 'deyo'), ('gn', 'ln'),
                    'label-shift'),
    'bs1': ('mnist-c_bs1', 'acc', ('tent', 'eata', 'sar', 'deyo'),
            ('gn', 'ln'), 'bs1'),
}
SCENARIO_TITLES = {'continual': 'Continual', 'mild': 'Mild',
                   'label-shift': 'Label shift (ratio inf)',
                   'bs1': 'Batch size 1'}
#: the paper's ImageNet-C model a demo net stands in for
PAPER_MODELS = {'bn': 'resnet50-bn', 'gn': 'resnet50-gn', 'ln': 'vit-b16'}
METHODS = ('bn_adapt', 'tent', 'eata', 'sar', 'deyo', 'cotta', 'ecotta')
#: EcoTTA: its own network (the CNN-BN with K=4 meta networks, warmed up on
#: the clean training digits by tools/ecotta_warmup.py) and its own
#: optimizer (SGD 5e-3, momentum 0.9: the authors' setting, not --lr).
ECOTTA_MODEL = 'cnn-bn_ecotta'
ECOTTA_WARMUP_EPOCHS = 10
BETA_GRID = (1.0, 30.0, 1000.0)
TRAIN_EPOCHS = {'bn': 8, 'gn': 12, 'ln': 16}
#: Options beyond the defaults (the authors' ImageNet code) for 10 classes
#: (the optimizer comes from ``--lr``): EATA's margins of
#: mariodoebler/test-time-adaptation's cifar10_c/eata.yaml (ImageNet's
#: 0.05 drops every sample), CoTTA without flips (a mirrored digit is
#: another glyph).
METHOD_OPTIONS = {'eata': dict(d_margin=0.4, fisher_alpha=1.0),
                  'cotta': dict(augment=dict(hflip_prob=None))}


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        description='Online-adaptation baselines +/- STAG on corrupted '
        'MNIST (offline)')
    p.add_argument('--work-dir', default='work_dirs/demo_cls')
    p.add_argument('--scenarios', nargs='+', default=['continual', 'mild'],
                   choices=list(SCENARIOS),
                   help='label-shift and bs1 are Table label_shifts_bs1\'s '
                   'scenarios on the GN and LN models (make demo-cls-hard)')
    p.add_argument('--nets', nargs='+', default=list(NETS),
                   choices=list(NETS),
                   help='keep only these models (continual runs on the BN '
                   'model only, as the paper runs it on BN WideResNets)')
    p.add_argument('--methods', nargs='+', default=list(METHODS),
                   choices=list(METHODS),
                   help='keep only these baselines (each scenario runs its '
                   'own among them)')
    p.add_argument('--n-test', type=int, default=1000,
                   help='test digits per corruption (default 1000)')
    p.add_argument('--beta-grid', type=float, nargs='+',
                   default=list(BETA_GRID),
                   help='beta0 values tried on the first corruption (three '
                   'decades: STAG nearly off to strong)')
    p.add_argument('--gamma-grid', type=float, nargs='+',
                   default=[10.0, 100.0])
    p.add_argument('--lr', type=float, default=1e-3,
                   help='Adam learning rate of every baseline at batch 64 '
                   '(CoTTA/TENT CIFAR-C protocol); batch 1 scales it by '
                   'the rule of SAR\'s main.py')
    p.add_argument('--warmup-epochs', type=int,
                   default=ECOTTA_WARMUP_EPOCHS,
                   help='epochs of EcoTTA\'s warm-up of its meta networks '
                   f'(default: {ECOTTA_WARMUP_EPOCHS})')
    p.add_argument('--epochs', type=int, default=None,
                   help='training epochs of every source model (default: '
                   f'{TRAIN_EPOCHS})')
    p.add_argument('--seed', type=int, default=0)
    p.add_argument('--workers', type=int, default=2,
                   help='processes that corrupt the images')
    p.add_argument('--native-kernels', action='store_true',
                   help="this processor's fastest kernel paths and two "
                   'threads instead of the pinned ones: faster, but the '
                   "numbers are this machine's own, not the docs' "
                   '(demo_data/kernel_paths.py)')
    args = p.parse_args(argv)
    # 5,000 digits: EATA's Fisher needs 2,000 clean training digits
    if not 1 <= args.n_test <= 3000:
        p.error(f'--n-test must be in [1, 3000], got {args.n_test}')
    for name in ('warmup_epochs', 'epochs', 'workers'):
        value = getattr(args, name)
        if value is not None and value < 1:
            p.error(f'--{name.replace("_", "-")} must be >= 1, got {value}')
    for name in ('beta_grid', 'gamma_grid'):
        if not all(v > 0 for v in getattr(args, name)):
            p.error(f'--{name.replace("_", "-")} values must be > 0, got '
                    f'{getattr(args, name)}')
    return args


def make_data(args, log):
    from demo_data.cls_data import (load_mnist_rgb, save_if_changed,
                                    split_train_test, write_corrupted_set)
    images, labels = load_mnist_rgb(32)
    (x_tr, y_tr), (x_te, y_te) = split_train_test(images, labels,
                                                  args.n_test, args.seed)
    root = osp.join(args.work_dir, 'data', 'MNIST-C')
    log(f'[1/5] data: {len(x_tr)} clean training digits, {len(x_te)} test '
        f'digits x 15 corruptions (severity 5) -> {root}')
    write_corrupted_set(root, x_te, y_te, severity=5, seed=args.seed,
                        workers=args.workers, log=log)
    # clean source-domain digits for EATA's Fisher information
    mnist = osp.join(args.work_dir, 'data', 'MNIST')
    clean = {k: osp.join(mnist, f'train_{k}.npy')
             for k in ('images', 'labels')}
    os.makedirs(mnist, exist_ok=True)
    save_if_changed(clean['images'], x_tr)
    save_if_changed(clean['labels'], y_tr)
    return root, clean, (x_tr, y_tr), (x_te, y_te)


def nets_in_use(args):
    """The ``--nets`` that a chosen scenario runs on."""
    return [n for n in args.nets
            if any(n in SCENARIOS[s][3] for s in args.scenarios)]


def network_config(net):
    """The ``CLS_MODELS`` config of a demo net (from its model base)."""
    from mmengine.config import Config
    path = osp.join(DEMO_BASE, 'models', f'{NETS[net][1]}.py')
    return Config.fromfile(path).model.network.to_dict()


def make_models(args, train, test, log):
    import torch

    from demo_data.cls_train import evaluate, train_classifier
    from mmseg_stag.classification import CLS_MODELS
    paths, clean = {}, {}
    for net in nets_in_use(args):
        title = NETS[net][0]
        cfg = network_config(net)
        path = osp.join(args.work_dir, 'models', f'{net}.pth')
        paths[net] = path
        epochs = args.epochs or TRAIN_EPOCHS[net]
        want = dict(seed=args.seed, epochs=epochs, n_test=args.n_test)
        meta = torch.load(path, weights_only=True)['meta'] \
            if osp.isfile(path) else {}
        if {k: meta.get(k) for k in want} == want:
            clean[net] = meta['clean_test_acc']
            log(f'[2/5] {title}: cached {path} (clean acc '
                f'{clean[net]:.1f}%)')
            continue
        log(f'[2/5] training {title} on the clean digits ({epochs} epochs)')
        torch.manual_seed(args.seed)
        model = CLS_MODELS.build(dict(cfg))
        train_classifier(model, *train, epochs=epochs, seed=args.seed,
                         log=log)
        clean[net] = evaluate(model, *test)
        log(f'    clean test accuracy {clean[net]:.1f}%')
        os.makedirs(osp.dirname(path), exist_ok=True)
        torch.save({'state_dict': model.state_dict(),
                    'meta': dict(clean_test_acc=clean[net], **want)}, path)
    return paths, clean


def stag_rows(scenario, net, methods):
    """The baselines that get a +STAG row: all, or those with a row in the
    paper's table for the setting the scenario stands in for."""
    from mmseg_stag.paper.hparams import PAPER_STAG
    setting = SCENARIOS[scenario][4]
    if setting is None:
        return list(methods)
    return [m for m in methods
            if ('imagenet-c', setting, PAPER_MODELS[net], m) in
            {row[:4] for row in PAPER_STAG}]


def row_config(args, scenario, net, method, data_root, source_files,
               stag=None):
    """The config of one row: the demo's model and stream bases, the
    method's base (``configs/cls/_base_/methods``), the demo's options."""
    from mmengine.config import Config
    model = ECOTTA_MODEL if method == 'ecotta' else NETS[net][1]
    bases = [osp.join(DEMO_BASE, 'models', f'{model}.py'),
             osp.join(DEMO_BASE, 'datasets', f'{SCENARIOS[scenario][0]}.py'),
             osp.join(CLS_BASE, 'methods', f'{method.replace("_", "-")}.py'),
             osp.join(CLS_BASE, 'default_runtime.py')]
    cfg = Config.fromstring(f'_base_ = {bases!r}\n', '.py')
    options = {'test_dataloader.dataset.corruption_set.data_root': data_root,
               'test_dataloader.dataset.shuffle_seed': args.seed,
               'randomness.seed': args.seed,
               'default_hooks.logger.interval': 1000,
               'log_level': 'WARNING'}  # the row's files hold the results
    if method not in ('source', 'ecotta'):
        from mmseg_stag.paper.protocol import batch_scaled_lr

        # SAR's batch rule; the CNNs follow it as the ResNets do
        lr = batch_scaled_lr(args.lr, cfg.test_dataloader.batch_size,
                             vit=net == 'ln')
        options['test_cfg.method'] = dict(
            METHOD_OPTIONS.get(method, {}), type=method,
            optimizer=dict(type='Adam', lr=lr, betas=(0.9, 0.999)))
    if method == 'eata':  # Fisher information: 2,000 clean digits
        options['test_cfg.source_dataloader'] = dict(
            batch_size=64, num_workers=0,
            sampler=dict(type='SeededShuffleSampler'),
            collate_fn=dict(type='pseudo_collate'),
            dataset=dict(type='SourceImages', images=dict(
                _delete_=True, type='NumpyImages', n_examples=2000,
                **source_files)))
    if stag is not None:
        options['test_cfg.method.stag'] = dict(stag)
    cfg.merge_from_dict(options)
    return cfg


def select_stag(args, scenario, net, method, data_root, source_files, ckpt,
                out):
    """Best (beta0, gamma) on the first corruption only
    (``tools/select_beta.py``), reused when the grid is unchanged."""
    from mmseg_stag.paper.protocol import select
    work_dir = osp.join(out, 'beta_selection', method)
    cache = osp.join(work_dir, 'beta_selection.json')
    grid = dict(beta_grid=list(args.beta_grid),
                gamma_grid=list(args.gamma_grid))
    if osp.isfile(cache):
        with open(cache) as f:
            chosen = json.load(f)
        if chosen.get('grid') == grid and chosen.get('ckpt_mtime') == \
                osp.getmtime(ckpt):
            return chosen
    os.makedirs(work_dir, exist_ok=True)
    cfg = row_config(args, scenario, net, method, data_root, source_files,
                     stag=dict(beta0=args.beta_grid[0],
                               gamma=args.gamma_grid[0]))
    chosen = select(cfg, ckpt, args.beta_grid, work_dir, args.gamma_grid,
                    log=None)
    chosen.update(grid=grid, ckpt_mtime=osp.getmtime(ckpt))
    from mmseg_stag.engine.report import write_json
    write_json(cache, chosen)
    return chosen


def make_ecotta_warmup(args, data_root, source_files, ckpt, log):
    """The CNN-BN with EcoTTA's meta networks warmed up on the clean
    training digits (``tools/ecotta_warmup.py``; cached)."""
    import torch

    from mmseg_stag.classification.ecotta_warmup import warm_up_checkpoint
    out = osp.join(args.work_dir, 'models', 'bn_ecotta-k4.pth')
    want = dict(epochs=args.warmup_epochs, seed=args.seed)
    if osp.isfile(out) and osp.getmtime(out) > osp.getmtime(ckpt):
        done = torch.load(out, weights_only=True)['meta']['ecotta_warmup']
        if {k: done.get(k) for k in want} == want:
            log(f'[2/5] EcoTTA: cached warmed-up meta networks {out}')
            return out
    log(f'[2/5] EcoTTA: warming the CNN-BN\'s meta networks up on the clean '
        f'digits ({args.warmup_epochs} epochs)')
    config = osp.join(args.work_dir, 'models', 'ecotta_warmup_config.py')
    row_config(args, 'continual', 'bn', 'ecotta', data_root,
               source_files).dump(config)
    warm_up_checkpoint(
        config, ckpt, out, source_files['images'],
        osp.join(args.work_dir, 'models', 'ecotta_warmup'),
        train_labels=source_files['labels'], epochs=args.warmup_epochs,
        seed=args.seed)
    return out


def run_setting(args, scenario, net, data_root, source_files, ckpt, log,
                warmed=None):
    from mmseg_stag.classification import METHOD_NAMES, SHORT_NAMES
    from mmseg_stag.classification.corruption_table import (
        format_corruption_table, read_corruption_row, write_corruption_table)
    from mmseg_stag.engine.runs import run_cached
    title = NETS[net][0]
    out = osp.join(args.work_dir, f'{scenario}_{net}')
    os.makedirs(out, exist_ok=True)
    metric, paired = SCENARIOS[scenario][1], SCENARIOS[scenario][2]
    # BN Adapt has nothing to adapt without BatchNorm
    methods = [m for m in paired if m in args.methods and
               not (m == 'bn_adapt' and net != 'bn')]
    rows, choices = [], {}

    def ckpt_of(method):
        return warmed if method == 'ecotta' else ckpt

    def run(method, name, base=None, stag=None):
        t0 = time.time()
        work_dir = osp.join(out, name.replace(' ', '-').replace('+', '-')
                            .lower())
        # tools/test.py's run; a finished row of this config is reused
        run_cached(row_config(args, scenario, net, method, data_root,
                              source_files, stag), ckpt_of(method), work_dir,
                   needs=('continual_results.json', 'per_image.csv'),
                   config_name='row_config.py')
        row = read_corruption_row(work_dir, name, base)
        rows.append(row)
        log(f'    {name:<14} avg acc {row["avg_acc"]:5.1f}%  '
            f'({time.time() - t0:.0f} s)')

    run('source', 'Source')
    with_stag = stag_rows(scenario, net, methods)
    for m in methods:
        name = METHOD_NAMES[m]
        if m not in with_stag:
            run(m, name)
            continue
        t0 = time.time()
        chosen = select_stag(args, scenario, net, m, data_root,
                             source_files, ckpt_of(m), out)
        stag = dict(beta0=chosen['beta0'], gamma=chosen['gamma'])
        choices[name] = dict(stag, trials=chosen['trials'])
        log(f'    {name}+STAG: beta0={stag["beta0"]:g}, '
            f'gamma={stag["gamma"]:g} (chosen on the first corruption, '
            f'{time.time() - t0:.0f} s)')
        run(m, name)
        run(m, f'{name}+STAG', base=name, stag=stag)
    head = f'{SCENARIO_TITLES[scenario]}, {title}'
    corruptions = list(rows[0]['per_corruption'])
    write_corruption_table(out, rows, corruptions, metric, head,
                           meta=dict(scenario=scenario, net=net,
                                     stag_choices=choices,
                                     n_test=args.n_test, seed=args.seed),
                           labels=SHORT_NAMES)
    table = format_corruption_table(rows, corruptions, metric, head,
                                    SHORT_NAMES)
    return dict(table=table, choices=choices, rows=rows, metric=metric)


def grid_edge(choice, args):
    """' (grid minimum)' / ' (grid maximum)' when beta0 is at an end of the
    grid (the minimum: STAG nearly off)."""
    if len(args.beta_grid) > 1 and choice['beta0'] == min(args.beta_grid):
        return ' (grid minimum)'
    if len(args.beta_grid) > 1 and choice['beta0'] == max(args.beta_grid):
        return ' (grid maximum)'
    return ''


def main(argv=None):
    args = parse_args(argv)
    # before NumPy or torch loads, here and in the processes it starts
    from demo_data.kernel_paths import pin_or_reexec
    pin_or_reexec(native=args.native_kernels)
    import torch

    import mmseg_stag  # noqa: F401  (registers the methods, STAGLoss)

    # pinned: one thread. Native: two where the machine has them, unless
    # OMP_NUM_THREADS says otherwise; empty counts as unset, as for OpenMP
    threads = os.environ.get('OMP_NUM_THREADS') or \
        str(max(1, min(2, os.cpu_count() or 1)))
    if not threads.isdigit() or int(threads) < 1:
        raise SystemExit(f'error: OMP_NUM_THREADS={threads!r} is not a '
                         'positive integer')
    torch.set_num_threads(int(threads))
    os.makedirs(args.work_dir, exist_ok=True)
    start = time.time()

    log = functools.partial(print, flush=True)
    data_root, source_files, train, test = make_data(args, log)
    ckpts, clean = make_models(args, train, test, log)
    summary = dict(clean_test_acc=clean, settings={})
    for scenario in args.scenarios:
        for net in [n for n in args.nets if n in SCENARIOS[scenario][3]]:
            log(f'[3-4/5] {scenario}, {NETS[net][0]}: choosing STAG '
                'hyper-parameters on the first corruption, then the '
                'stream')
            warmed = None
            if 'ecotta' in args.methods and net == 'bn' and \
                    'ecotta' in SCENARIOS[scenario][2]:
                warmed = make_ecotta_warmup(args, data_root, source_files,
                                            ckpts[net], log)
            res = run_setting(args, scenario, net, data_root, source_files,
                              ckpts[net], log, warmed)
            summary['settings'][f'{scenario}_{net}'] = res
            log('\n' + res['table'] + '\n')
    elapsed = time.time() - start
    summary['time_s'] = round(elapsed, 1)
    from mmseg_stag.engine.report import write_json
    write_json(osp.join(args.work_dir, 'summary.json'), summary)
    lines = ['# Classification demo (corrupted MNIST, severity 5)', '',
             'Clean test accuracy: ' + ', '.join(
                 f'{NETS[n][0]} {a:.1f}%' for n, a in clean.items()), '',
             f'STAG grid: beta0 in {args.beta_grid}, gamma in '
             f'{args.gamma_grid}; "(grid minimum)": the smallest beta0 won '
             '(STAG nearly off), "(grid maximum)": the largest.', '']
    for key, res in summary['settings'].items():
        lines += [f'## {key}', '', '```', res['table'], '```', '',
                  'STAG (chosen on the first corruption): ' + ', '.join(
                      f'{m} beta0={c["beta0"]:g}{grid_edge(c, args)} '
                      f'gamma={c["gamma"]:g}'
                      for m, c in res['choices'].items()), '']
    lines.append(f'Total time: {elapsed / 60:.1f} min')
    with open(osp.join(args.work_dir, 'summary.md'), 'w') as f:
        f.write('\n'.join(lines) + '\n')
    log('[5/5] ' + '\n'.join(lines[2:]))
    log(f'summary: {osp.join(args.work_dir, "summary.md")}')


if __name__ == '__main__':
    main()
