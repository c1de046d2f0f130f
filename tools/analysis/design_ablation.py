"""Table ablation_design: STAG's anchor (Diagonal / Full) x label (Hard /
Soft) for several baselines, and each baseline without STAG, on one
stage of a stream (the paper: ViT-B on ImageNet-C Gaussian noise).

    python tools/analysis/design_ablation.py CHECKPOINT \\
        --row TENT \\
            configs/cls/imagenet-c/imagenet-c_mild_vit-b16_tent-stag.py \\
        --row EATA \\
            configs/cls/imagenet-c/imagenet-c_mild_vit-b16_eata-stag.py \\
        [--condition gaussian_noise] [--whole-stream] \\
        [--work-dir work_dirs/analysis/ablation_design] [--cfg-options ...]

Each ``--row NAME CONFIG`` is a ``-stag`` config; the tool runs it five
times through tools/test.py's run (``test_cfg.method.stag`` off, then
``anchor`` x ``label``), one work dir per run (a finished run of the same
config is reused). Writes ``ablation_design.{txt,csv,json,png}``: the score
(accuracy or mIoU) of each variant per baseline.
"""
import copy
import os.path as osp
import sys

from mmseg_stag.engine.runs import run_cached

# benchmarks/ (what these commands share) is the repository's, not an
# installed package's: the repository's root on the path
REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

from benchmarks.rows import (mean_score, parse_rows, pyplot, require_stag,
                             row_parser, save_figure, stage_config,
                             write_numbers)

NAME = 'ablation_design'
#: the table's rows: (title, stag options; None: STAG off)
VARIANTS = (('Baseline (No STAG)', None),
            ('Full / Soft', dict(anchor='full', label='soft')),
            ('Full / Hard', dict(anchor='full', label='hard')),
            ('Diagonal / Soft', dict(anchor='diagonal', label='soft')),
            ('Diagonal / Hard (Ours)', dict(anchor='diagonal', label='hard')))


def parse_args(argv=None):
    p = row_parser('STAG design ablation (Table ablation_design)',
                   'work_dirs/analysis/ablation_design')
    p.add_argument('--whole-stream', action='store_true',
                   help='run every stage, not only the first')
    return parse_rows(p, argv)


def row_configs(config, cfg_options, condition, whole_stream):
    """The five configs of one baseline, in :data:`VARIANTS` order."""
    cfg = stage_config(config, cfg_options, condition,
                       whole_stream=whole_stream)
    require_stag(cfg, config)
    configs = []
    for _, stag in VARIANTS:
        variant = copy.deepcopy(cfg)  # Config.copy shares nested dicts
        if stag is None:
            variant.test_cfg.method.pop('stag')
        else:
            variant.merge_from_dict({f'test_cfg.method.stag.{k}': v
                                     for k, v in stag.items()})
        configs.append(variant)
    return configs


def plot(path, table, names):
    fig, ax = pyplot().subplots(figsize=(1.8 + 2.2 * len(names), 4))
    width = 0.8 / len(VARIANTS)
    for i, (title, _) in enumerate(VARIANTS):
        xs = [j + (i - (len(VARIANTS) - 1) / 2) * width
              for j in range(len(names))]
        bars = ax.bar(xs, [table[n][title] for n in names], width,
                      label=title, color='0.6' if i == 0 else f'C{i}')
        ax.bar_label(bars, fmt='%.1f', fontsize=7, rotation=90, padding=2)
    ax.set_xticks(range(len(names)), names)
    ax.set_ylabel(table['score'])
    top = max(table[n][t] for n in names for t, _ in VARIANTS)
    ax.set_ylim(0, max(top * 1.18, 1.0))
    ax.legend(fontsize=8, ncol=3, loc='upper center',
              bbox_to_anchor=(0.5, -0.08))
    ax.set_title('Ablation on STAG\'s design (anchor / label)', fontsize=10)
    save_figure(fig, path, crop=True)


def main(argv=None):
    args = parse_args(argv)
    table, names = {}, [n for n, _ in args.row]
    for name, config in args.row:
        table[name] = {}
        configs = row_configs(config, args.cfg_options, args.condition,
                              args.whole_stream)
        for (title, _), cfg in zip(VARIANTS, configs):
            slug = title.split(' (')[0].replace(' / ', '-').lower()
            work = osp.join(args.work_dir, name.lower(), slug)
            score, key = mean_score(run_cached(cfg, args.checkpoint, work))
            table[name][title] = score
            table['score'] = key
            print(f'{name:8s} {title:24s} {key} {score:.2f}')
    lines = [f'{"Design variant":26s}' + ''.join(f'{n:>10s}' for n in names)]
    for title, _ in VARIANTS:
        lines.append(f'{title:26s}' + ''.join(
            f'{table[n][title]:10.2f}' for n in names))
    text = '\n'.join(lines)
    base = write_numbers(
        args.work_dir, NAME, dict(table=table, rows=dict(args.row),
                                  condition=args.condition,
                                  whole_stream=args.whole_stream),
        ['variant'] + names,
        [[title] + [table[n][title] for n in names] for title, _ in VARIANTS])
    with open(base + '.txt', 'w') as f:
        f.write(f'{table["score"]} per design variant\n{text}\n')
    plot(base + '.png', table, names)
    print(text)
    print(f'wrote {base}.png, .txt, .csv, .json')
    return table


if __name__ == '__main__':
    main()
