"""Figure structural_anchor: the classifier weights as structural anchors.

    python tools/analysis/anchor_validation.py \\
        --model CNN-BN configs/cls/demo/_base_/models/cnn-bn.py \\
            work_dirs/demo_cls/models/bn.pth \\
        --model ViT-LN configs/cls/demo/_base_/models/vit-ln.py \\
            work_dirs/demo_cls/models/ln.pth \\
        [--heatmap-model CNN-BN] [--heatmap-classes 20] \\
        [--out work_dirs/analysis]

Each ``--model NAME CONFIG CHECKPOINT`` is built from its config (a
classification ``OnlineClassifier`` or an MMSeg segmentor; the classifier is
the one the online loop adapts: ``test_cfg.head_layer``, else the task's)
and loaded strictly. Writes ``structural_anchor.png`` ((a) the assignment
matrix ``softmax(W W^T + b)`` of ``--heatmap-classes`` classes of the heatmap
model, (b) self-entropy H, mean diagonal probability psi and structural
accuracy per model) and the numbers as ``structural_anchor.{json,csv}``.
"""
import argparse
import os.path as osp
import sys
from typing import Dict, List, Optional

import torch
from mmengine.config import Config
from mmengine.registry import MODELS, init_default_scope

from mmseg_stag.checkpoint import load_model_checkpoint
from mmseg_stag.core.stag import check_classifier, inter_class_logits
from mmseg_stag.engine.online_task import build_task, head_layer_of

# benchmarks/ (what these commands share) is the repository's, not an
# installed package's: the repository's root on the path
REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

from benchmarks.rows import check_files, pyplot, save_figure, write_numbers

NAME = 'structural_anchor'
#: a model's numbers, in the CSV's order
COLUMNS = ('self_entropy', 'mdp', 'structural_accuracy', 'num_classes')


@torch.no_grad()
def assignment_matrix(weight: torch.Tensor,
                      bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Return ``P_kj = softmax_j(w_j . w_k + b_j)`` (eq:inter-class_matrix)."""
    weight = check_classifier(weight, bias).double()
    bias = None if bias is None else bias.detach().double()
    return inter_class_logits(weight, bias).softmax(dim=1)


@torch.no_grad()
def anchor_validation(weight: torch.Tensor,
                      bias: Optional[torch.Tensor] = None) -> Dict[str, float]:
    """The figure's numbers for one classifier: ``self_entropy``
    (eq:self_entropy, nats), ``mdp`` (mean of ``P_kk``),
    ``structural_accuracy`` (%) and ``num_classes``."""
    p = assignment_matrix(weight, bias)
    log_p = p.clamp_min(torch.finfo(p.dtype).tiny).log()
    # on the matrix's device: a CUDA classifier is compared on the GPU
    classes = torch.arange(p.shape[0], device=p.device)
    return dict(
        self_entropy=float(-(p * log_p).sum(1).mean()),
        mdp=float(p.diagonal().mean()),
        structural_accuracy=100.0 * float(
            (p.argmax(1) == classes).double().mean()),
        num_classes=int(p.shape[0]))


def heatmap_classes(num_classes: int, count: int = 20) -> List[int]:
    """``count`` (at least 2) classes evenly spread over ``0 ..
    num_classes - 1``."""
    if count < 2:
        raise ValueError(f'the heatmap needs at least 2 classes, got {count}')
    if num_classes < count:
        raise ValueError(f'the heatmap shows {count} classes but the '
                         f'classifier has {num_classes}: pass '
                         f'--heatmap-classes {num_classes} (or fewer)')
    step = (num_classes - 1) / (count - 1)
    return [round(i * step) for i in range(count)]


def parse_args(argv=None):
    p = argparse.ArgumentParser(description='classifier weights as '
                                'structural anchors (Figure '
                                'structural_anchor)')
    p.add_argument('--model', nargs=3, action='append', required=True,
                   metavar=('NAME', 'CONFIG', 'CHECKPOINT'),
                   help='a model to analyse (repeat for several)')
    p.add_argument('--heatmap-model', default=None,
                   help='the model of panel (a) (default: the first)')
    p.add_argument('--heatmap-classes', type=int, default=20)
    p.add_argument('--out', default='work_dirs/analysis')
    p.add_argument('--trust-pickle', action='store_true')
    args = p.parse_args(argv)
    names = [m[0] for m in args.model]
    if len(set(names)) != len(names):
        p.error(f'--model names must differ, got {names}')
    check_files(p, [(f'--model {name}: {what}', path)
                    for name, *paths in args.model
                    for what, path in zip(('config', 'checkpoint'), paths)])
    if args.heatmap_model is None:
        args.heatmap_model = names[0]
    elif args.heatmap_model not in names:
        p.error(f'--heatmap-model {args.heatmap_model!r} is not one of '
                f'{names}')
    return args


def load_classifier(name, config, checkpoint, trust_pickle=False):
    """The classifier module the online loop would adapt, with the
    checkpoint's weights."""
    cfg = Config.fromfile(config)
    # a model base has no runtime: its scope follows from the model type
    init_default_scope(cfg.get('default_scope') or (
        'mmseg_stag' if cfg.model.get('type') == 'OnlineClassifier'
        else 'mmseg'))
    classifier = head_layer_of(cfg)
    try:
        model = MODELS.build(cfg.model)
        task = build_task(model, None, classifier)
    except ValueError as err:
        raise ValueError(f'--model {name} ({config}): {err}') from err
    load_model_checkpoint(model, checkpoint, trust_pickle, classifier)
    return task.probe.classifier(task.adapted_module(model))


def plot(path, results, heatmap, heatmap_name, classes):
    fig = pyplot().figure(figsize=(13, 4.6))
    grid = fig.add_gridspec(1, 4, width_ratios=[1.5, 1, 1, 1], wspace=0.45)
    ax = fig.add_subplot(grid[0])
    im = ax.imshow(heatmap, vmin=0, vmax=1, cmap='viridis')
    ticks = range(len(classes))
    ax.set_xticks(ticks, [str(c) for c in classes], fontsize=7, rotation=90)
    ax.set_yticks(ticks, [str(c) for c in classes], fontsize=7)
    ax.set_xlabel('assigned class j')
    ax.set_ylabel('virtual input w_k (class k)')
    ax.set_title(f'(a) softmax(W W^T + b), {heatmap_name}', fontsize=10)
    fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04)
    names = list(results)
    panels = (('self_entropy', 'H (nats)', None), ('mdp', 'psi (MDP)', 1.05),
              ('structural_accuracy', 'structural acc. (%)', 110))
    for i, (key, label, top) in enumerate(panels):
        ax = fig.add_subplot(grid[i + 1])
        values = [results[n][key] for n in names]
        bars = ax.bar(range(len(names)), values, color=f'C{i}')
        ax.bar_label(bars, fmt='%.3g', fontsize=8)
        ax.set_xticks(range(len(names)), names, rotation=30, ha='right',
                      fontsize=8)
        ax.set_title(('(b) ' if i == 0 else '') + label, fontsize=10)
        ax.set_ylim(0, top or max(values) * 1.2 or 1)
    save_figure(fig, path, crop=True)


def main(argv=None):
    args = parse_args(argv)
    results = {}
    for name, config, ckpt in args.model:
        fc = load_classifier(name, config, ckpt, args.trust_pickle)
        r = results[name] = anchor_validation(fc.weight, fc.bias)
        if name == args.heatmap_model:
            classes = heatmap_classes(r['num_classes'], args.heatmap_classes)
            p = assignment_matrix(fc.weight, fc.bias)
            heatmap = p[classes][:, classes].numpy()
        print(f'{name}: H {r["self_entropy"]:.4f} nats, psi {r["mdp"]:.4f}, '
              f'structural accuracy {r["structural_accuracy"]:.1f} % '
              f'({r["num_classes"]} classes)')
    base = write_numbers(
        args.out, NAME, dict(models=results, heatmap_model=args.heatmap_model,
                             heatmap_classes=classes, heatmap=heatmap.tolist(),
                             sources={n: dict(config=c, checkpoint=k)
                                      for n, c, k in args.model}),
        ['model', *COLUMNS],
        [[name, *(r[k] for k in COLUMNS)] for name, r in results.items()])
    plot(base + '.png', results, heatmap, args.heatmap_model, classes)
    print(f'wrote {base}.png, .json, .csv')
    return results


if __name__ == '__main__':
    main()
