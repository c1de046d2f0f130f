"""Record the demos' scores as the stand-in numbers of the docs' support
matrix (``docs/results/stand-in.json``, read by ``tools/docs_hooks.py``).

    python tools/record_stand_in.py --measured "2026-11-26, 2 CPU cores" \
        [--demo work_dirs/demo [work_dirs/demo_hybrid]] \
        [--demo-cls work_dirs/demo_cls] \
        [--out docs/results/stand-in.json]

Each demo setting stands in for one of the paper's: the demo's tiny
SegFormer on synthetic ACDC for the SegFormer-B5 on ACDC, the continual
CNN-BN on corrupted MNIST for CIFAR-10-C's WideResNet-28, the mild and
hard scenarios' CNN-BN/CNN-GN/ViT-LN for ImageNet-C's ResNet50-BN/-GN and
ViT-B/16 (``tools/demo_cls.py`` ``PAPER_MODELS``).
"""
import argparse
import glob
import json
import os
import os.path as osp

#: the demo's title of a method, as the tables print it
TITLES = {'Source': 'source', 'BN Adapt': 'bn_adapt', 'TENT': 'tent',
          'EATA': 'eata', 'SAR': 'sar', 'DeYO': 'deyo', 'CoTTA': 'cotta',
          'EcoTTA': 'ecotta-k4'}  # the demo's EcoTTA has K=4 meta networks
PAPER_MODELS = {'bn': 'resnet50-bn', 'gn': 'resnet50-gn', 'ln': 'vit-b16'}
DEMO_NETS = {'bn': 'CNN-BN', 'gn': 'CNN-GN', 'ln': 'ViT-LN'}


def segmentation_rows(demo_dir):
    """The rows of ``make demo``'s ``demo_comparison.json``."""
    path = osp.join(demo_dir, 'demo_comparison.json')
    if not osp.isfile(path):
        raise FileNotFoundError(f'{path}: no make demo results there')
    with open(path) as f:
        runs = json.load(f)['runs']
    names = [r['name'].split(' ')[0] for r in runs]  # 'tent-stag (beta0=..)'
    return [dict(benchmark='acdc', scenario='continual',
                 model='segformer-b5',
                 method=name.replace('-stag', '').replace('-', '_'),
                 stag=name.endswith('-stag'),
                 score=r['mIoU_mean_over_stages'],
                 stand_in='make demo: tiny SegFormer, synthetic ACDC')
            for name, r in zip(names, runs)]


def classification_rows(demo_cls_dir):
    """The rows of ``make demo-cls``'s per-setting ``table.json``."""
    paths = sorted(glob.glob(osp.join(demo_cls_dir, '*', 'table.json')))
    if not paths:
        raise FileNotFoundError(f'{demo_cls_dir}: no */table.json (make '
                                'demo-cls results) there')
    rows = []
    for path in paths:
        with open(path) as f:
            table = json.load(f)
        # work dirs of mmseg_stag 0.3 spell label-shift label_shift
        scenario = table['meta']['scenario'].replace('_', '-')
        net = table['meta']['net']
        benchmark, model = (('cifar10-c', 'wrn-28-10')
                            if scenario == 'continual' else
                            ('imagenet-c', PAPER_MODELS[net]))
        metric = table['metric']
        for r in table['rows']:
            title = r['base'] or r['name']
            rows.append(dict(
                benchmark=benchmark, scenario=scenario, model=model,
                method=TITLES[title], stag=r['base'] is not None,
                score=r[f'avg_{metric}'],
                stand_in=f'make demo-cls: {DEMO_NETS[net]}, corrupted '
                'MNIST'))
    return rows


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    p.add_argument('--measured', required=True,
                   help='when and on what machine the demos ran')
    p.add_argument('--demo', nargs='+', default=['work_dirs/demo'],
                   help='make demo work dirs (make demo-hybrid\'s too)')
    p.add_argument('--demo-cls', default='work_dirs/demo_cls')
    p.add_argument('--out', default='docs/results/stand-in.json')
    args = p.parse_args(argv)
    rows = {}
    for demo in args.demo:  # make demo-hybrid's dir repeats make demo's rows
        for row in segmentation_rows(demo):
            key = tuple(row[k] for k in ('scenario', 'model', 'method',
                                         'stag'))
            if key in rows and rows[key]['score'] != row['score']:
                raise SystemExit(f'error: {demo}: {row["method"]} '
                                 f'(stag={row["stag"]}) scored '
                                 f'{row["score"]}, another --demo dir '
                                 f'{rows[key]["score"]}: not one run\'s data')
            rows.setdefault(key, row)
    rows = list(rows.values())
    rows += classification_rows(args.demo_cls)
    os.makedirs(osp.dirname(osp.abspath(args.out)), exist_ok=True)
    with open(args.out, 'w') as f:
        json.dump(dict(measured=args.measured, rows=rows), f, indent=1)
        f.write('\n')
    print(f'{len(rows)} rows -> {args.out}')


if __name__ == '__main__':
    main()
