"""Figure t-SNE: the classifier-input features of a stream's last batches
for several runs (the paper: Source, TENT, TENT+STAG of ViT-B on
ImageNet-C Frost), coloured by class, with the class anchors marked.

    python tools/analysis/tsne.py CHECKPOINT \\
        --row Source CONFIG_SOURCE --row TENT CONFIG_TENT \\
        --row TENT+STAG CONFIG_TENT_STAG [--condition frost] \\
        [--last-batches 8] [--images N] [--seed 0] \\
        [--work-dir work_dirs/analysis/tsne] [--cfg-options ...]

Each row runs through tools/test.py's run on one stage (the first
corruption, or ``--condition``); a hook keeps the classifier's input
features ``h`` of the first classifier call of each of the last
``--last-batches`` batches (the prediction's forward) with the images'
labels. The features of all rows and the anchors are embedded by
scikit-learn's TSNE together (seeded), so the panels share one map. The
anchors ``a_k = s_k w_k`` (eq:structural_anchor) are drawn as their
direction ``sign(s_k) a_k / |a_k|`` scaled to the mean feature norm (STAG
aligns ``g = s h`` with ``a``, i.e. ``h`` with that direction). Writes
``tsne.{png,json,csv}``.
"""
import os.path as osp
import sys

import torch
from mmengine.hooks import Hook

from mmseg_stag.core.stag import anchor_coefficients

# benchmarks/ (what these commands share) is the repository's, not an
# installed package's: the repository's root on the path
REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

from benchmarks.rows import (parse_rows, pyplot, row_parser, run_stage,
                             save_figure, slug, write_numbers)

NAME = 'tsne'


def parse_args(argv=None):
    p = row_parser('t-SNE of the classifier-input features (Figure t-SNE)',
                   'work_dirs/analysis/tsne')
    p.add_argument('--last-batches', type=int, default=8)
    p.add_argument('--images', type=int, default=None,
                   help='images of the stage to run (default: all)')
    p.add_argument('--seed', type=int, default=0)
    args = parse_rows(p, argv)
    if args.last_batches < 1:
        p.error('--last-batches must be >= 1')
    return args


def feature_hook(store, last):
    """An MMEngine hook keeping the classifier input of the first
    classifier call of each batch and the batch's labels (last ``last``
    batches), and the classifier's final weight and bias."""
    class FeatureKeeper(Hook):
        priority = 'LOWEST'

        def before_test_epoch(self, runner):
            task = runner.test_loop.task  # the task the loop adapts with
            if task.prediction_kind != 'per_sample':
                raise ValueError('the t-SNE takes per-sample features (a '
                                 'classification run)')
            self.classifier = task.probe.classifier(
                task.adapted_module(runner.model))
            self.handle = self.classifier.register_forward_pre_hook(
                self.keep)
            self.current = None

        def keep(self, _, args):
            if self.current is None:
                self.current = args[0].detach().float().cpu().clone()

        def before_test_iter(self, runner, batch_idx, data_batch=None):
            self.current = None

        def after_test_iter(self, runner, batch_idx, data_batch=None,
                            outputs=None):
            labels = [int(s['gt_label'] if isinstance(s, dict)
                          else s.gt_label) for s in outputs]
            store['batches'].append((self.current, labels))
            del store['batches'][:-last]

        def after_test_epoch(self, runner, metrics=None):
            self.handle.remove()
            store['weight'] = self.classifier.weight.detach().float().cpu()
            bias = self.classifier.bias
            store['bias'] = None if bias is None else \
                bias.detach().float().cpu()

    return FeatureKeeper()


def run_row(config, args, work_dir):
    """``(features [n, D], labels [n], weight, bias)`` of one run."""
    store = dict(batches=[])
    run_stage(config, args, work_dir, feature_hook(store, args.last_batches))
    features = torch.cat([f for f, _ in store['batches']])
    labels = torch.tensor([y for _, ys in store['batches'] for y in ys])
    return features, labels, store['weight'], store['bias']


def anchor_points(weight, bias, scale):
    """The anchors' directions ``sign(s_k) a_k / |a_k|`` times ``scale``."""
    s = anchor_coefficients(weight.double(), None if bias is None
                            else bias.double())
    anchors = s[:, None] * weight.double()
    directions = anchors * s.sign()[:, None]
    return (directions / directions.norm(dim=1, keepdim=True).clamp_min(
        1e-12) * scale).float()


def plot(path, coords, names, num_classes):
    plt = pyplot()
    fig, axes = plt.subplots(1, len(names), figsize=(4.4 * len(names), 4.4),
                             squeeze=False)
    cmap = plt.get_cmap('tab10' if num_classes <= 10 else 'tab20')
    for ax, name in zip(axes[0], names):
        c = coords[name]
        ax.scatter(c['x'], c['y'], c=[cmap(y % cmap.N) for y in c['label']],
                   s=8, alpha=0.7, linewidths=0)
        ax.scatter(c['anchor_x'], c['anchor_y'], marker='*', s=160,
                   c=[cmap(k % cmap.N) for k in range(len(c['anchor_x']))],
                   edgecolors='k', linewidths=0.8)
        ax.set_title(f'{name} ({len(c["x"])} features)', fontsize=10)
        ax.set_xticks([])
        ax.set_yticks([])
    fig.suptitle('t-SNE of the classifier-input features (stars: class '
                 'anchors)', fontsize=10)
    save_figure(fig, path)


def csv_rows(coords):
    """The CSV's rows: each run's features, then its anchors."""
    for name, c in coords.items():
        for x, y, label in zip(c['x'], c['y'], c['label']):
            yield [name, 'feature', label, x, y]
        for k, (x, y) in enumerate(zip(c['anchor_x'], c['anchor_y'])):
            yield [name, 'anchor', k, x, y]


def main(argv=None):
    args = parse_args(argv)
    from sklearn.manifold import TSNE  # the optional analysis extra
    rows = {name: run_row(config, args, osp.join(args.work_dir, slug(name)))
            for name, config in args.row}
    blocks, spans = [], {}
    for name, (features, labels, weight, bias) in rows.items():
        scale = float(features.norm(dim=1).mean())
        anchors = anchor_points(weight, bias, scale)
        start = sum(len(b) for b in blocks)
        blocks += [features, anchors]
        spans[name] = (start, len(features), len(anchors))
    data = torch.cat(blocks).numpy()
    perplexity = float(min(30, max(2, (len(data) - 1) // 3)))
    embedded = TSNE(n_components=2, perplexity=perplexity, init='pca',
                    random_state=args.seed).fit_transform(data)
    coords = {}
    for name, (start, n, k) in spans.items():
        pts, anc = embedded[start:start + n], embedded[start + n:
                                                      start + n + k]
        coords[name] = dict(x=pts[:, 0].tolist(), y=pts[:, 1].tolist(),
                            label=rows[name][1].tolist(),
                            anchor_x=anc[:, 0].tolist(),
                            anchor_y=anc[:, 1].tolist())
    base = write_numbers(
        args.work_dir, NAME,
        dict(rows=coords, perplexity=perplexity, seed=args.seed,
             condition=args.condition, last_batches=args.last_batches,
             configs=dict(args.row)),
        ['run', 'kind', 'class', 'x', 'y'], csv_rows(coords))
    num_classes = int(next(iter(rows.values()))[2].shape[0])
    plot(base + '.png', coords, list(coords), num_classes)
    print(f'wrote {base}.png, .json, .csv ({len(data)} points, perplexity '
          f'{perplexity:g})')
    return coords


if __name__ == '__main__':
    main()
