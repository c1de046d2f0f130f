"""Check a set-up in minutes, before the table's GPU-hours.

    python tools/check_setup.py CONFIG CHECKPOINT [--data-root DIR]
        [--expected FILE] [--corruptions C ...] [--images N]
        [--work-dir DIR] [--no-run] [--trust-pickle]
        [--cfg-options KEY=VALUE ...]

Three checks, each PASS or FAIL, then a verdict and the next command:

1. data: the tree the config reads (ACDC: per condition the image count of
   the protocol, every image's train-id label; ImageNet-C / CIFAR-C: every
   corruption's folder or file and its counts), before any model is built;
2. checkpoint: the class count of its classifier, the converter's meta for
   an ``*nvlabs*`` config, a strict load into the config's model;
3. source: the config's model with the method replaced by Source through
   ``tools/test.py``'s own run (``mmseg_stag.engine.runs``): ACDC round 1
   (Source does not adapt, so round 1 is its row), or a few hundred images
   of a few corruptions, beside the paper's Source numbers within a stated
   tolerance, or beside ``--expected FILE``'s.

A fast preset (``test_cfg.preset``, ``…_bf16.py`` / ``…_bf16-graph.py``)
is checked as it will run: its options that change Source's numbers
(bfloat16 autocast, SDPA attention) stay and are named beside the
tolerance, those of the adapting method (the CUDA graph of its step) go
with it. A preset runs on a CUDA GPU only: without one the source check
fails with the command that checks the faithful config instead.

Each check prints how long it took, the end the whole time. Exit status 0
when every check passes, 1 otherwise. docs/get-started.md ("Check the
set-up in minutes") says what each check does, docs/faq.md ("Checking the
set-up") what each failure means.
"""
import argparse
import copy
import json
import math
import os
import os.path as osp
import re
import shlex
import sys
import time
from typing import Dict, List, Optional, Tuple

import numpy as np
from mmengine.config import Config, ConfigDict, DictAction

REPO = osp.dirname(osp.dirname(osp.abspath(__file__)))
if REPO not in sys.path:  # the package, not installed in a checkout
    sys.path.insert(0, REPO)

from mmseg_stag.checkpoint import (extract_state_dict, load_checkpoint_file,
                                   load_model_checkpoint)
from mmseg_stag.classification.data import CORRUPTIONS
from mmseg_stag.paper.results import PAPER_RESULTS
from mmseg_stag.paper.tables import setting_of

# ---------------------------------------------------------------- the paper

#: Table acdc_continual, Source, round 1 (mIoU %, NVlabs SegFormer-B5)
PAPER_ACDC_SOURCE = {'fog': 69.1, 'night': 40.3, 'rain': 59.7, 'snow': 57.8}
#: Source does not adapt, so a right set-up reproduces each condition up to
#: numerics (GPU kernels, the bilinear resizes; well under 0.5 point) and the
#: paper's rounding to 0.1; a wrong one (labels, normalisation, resize, an
#: unconverted head, NVlabs' LayerNorm eps) moves mIoU by points. 1.0 sits
#: between the two (docs/get-started.md says why).
ACDC_TOLERANCE = 1.0
#: A fast preset keeps bfloat16 autocast (and SDPA attention): compared with
#: the paper's float32 Source within the same ACDC_TOLERANCE. bfloat16 moves
#: Source's mIoU by far less than a wrong set-up: on the demo's trained
#: SegFormer (make demo's MiT-tiny, its round-1 Source, 10 images a
#: condition at 256x128; 2026-11-29, CPU) bfloat16 autocast moved the four
#: conditions by +0.03, +0.14, +0.04, -0.04 points, with SDPA on views
#: +0.02, +0.17, +0.05, -0.03 (SDPA alone: 1e-6). No GPU run of the B5 has
#: measured it yet (docs/get-started.md).
BF16_SHIFT = 0.17
#: the protocol's stream: ACDC's train split, 400 images each condition
ACDC_IMAGES = 400
ACDC_CLASSES = 19

#: the paper's Source rows per corruption (in CORRUPTIONS order): Table mild
#: (ImageNet-C accuracy %; Source adapts nothing, so the other scenarios'
#: Source is the same: their tables repeat its mean) and Tables
#: cifar-10-c_continual / cifar-100-c_continual (error %)
PAPER_CLS_SOURCE = {
    ('imagenet-c', 'resnet50-bn'): ('acc', (
        2.2, 2.9, 1.8, 17.9, 9.8, 14.8, 22.5, 16.9, 23.3, 24.4, 58.9, 5.4,
        16.9, 20.6, 31.7)),
    ('imagenet-c', 'resnet50-gn'): ('acc', (
        18.0, 19.8, 17.9, 19.8, 11.3, 21.4, 24.9, 40.4, 47.3, 33.6, 69.3,
        36.3, 18.6, 28.4, 52.3)),
    ('imagenet-c', 'vit-b16'): ('acc', (
        9.5, 6.7, 8.2, 29.0, 23.4, 33.9, 27.1, 15.9, 26.5, 47.2, 54.7, 44.1,
        30.5, 44.5, 47.8)),
    ('cifar10-c', 'wrn-28-10'): ('err', (
        72.3, 65.7, 72.9, 47.0, 54.3, 34.8, 42.0, 25.1, 41.3, 26.0, 9.3, 46.7,
        26.6, 58.5, 30.3)),
    ('cifar100-c', 'wrn-40-2'): ('err', (
        65.7, 60.1, 59.1, 32.1, 51.0, 33.6, 32.4, 41.4, 45.2, 51.4, 31.6,
        55.5, 40.3, 59.7, 42.4)),
}
#: the released data: classes, and images per corruption at one severity
CLS_DATA = {'imagenet-c': (1000, 50000), 'cifar10-c': (10, 10000),
            'cifar100-c': (100, 10000)}
#: a subset's Source number differs from the full set's by sampling: the
#: tolerance is this many binomial standard errors of the subset, plus
#: CLS_SLACK points for the paper's rounding and library numerics
CLS_SIGMAS = 3.0
CLS_SLACK = 1.0
#: one noise, one blur, one weather corruption by default
DEFAULT_CORRUPTIONS = ('gaussian_noise', 'defocus_blur', 'fog')
DEFAULT_IMAGES = 500


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description='Check data, checkpoint and protocol in minutes: Source '
        'on round 1 (ACDC) or on a few corruptions beside the paper')
    add = parser.add_argument
    add('config', help='a config of the table (its method is replaced by '
        'Source for the run)')
    add('checkpoint', help='the source checkpoint')
    add('--data-root', help='the data folder (default: the config\'s)')
    add('--expected', metavar='FILE', help='JSON of the expected numbers and '
        'tolerance, replacing the paper\'s (keys: scores, tolerance, and '
        'images_per_condition / images_per_corruption, classes)')
    add('--corruptions', nargs='+', help='classification: the corruptions '
        f'run (default: {" ".join(DEFAULT_CORRUPTIONS)})')
    add('--images', type=int, default=DEFAULT_IMAGES, help='classification: '
        'images per corruption run (ImageNet-C: a seeded random subset, '
        'CIFAR-C: the first N; default %(default)s)')
    add('--work-dir', help='the Source run\'s work dir (default: '
        'work_dirs/check_setup/<config name>)')
    add('--no-run', action='store_true', help='the data and checkpoint '
        'checks only')
    add('--trust-pickle', action='store_true', help='as tools/test.py: a '
        'trusted legacy pickle')
    add('--cfg-options', nargs='+', action=DictAction, help='as tools/test.py')
    args = parser.parse_args(argv)
    if args.images < 1:
        parser.error('--images must be >= 1')
    return args


def load_cfg(args) -> Config:
    """The config as tools/test.py reads it, ``--data-root`` applied."""
    if not osp.isfile(args.config):
        raise SystemExit(f'error: config file not found: {args.config}')
    cfg = Config.fromfile(args.config)
    if args.cfg_options:
        cfg.merge_from_dict(args.cfg_options)
    if args.data_root:
        ds = cfg.test_dataloader.dataset
        (ds.corruption_set if is_classification(cfg) else ds).data_root = \
            args.data_root
    return cfg


def is_classification(cfg) -> bool:
    return cfg.model.get('type') == 'OnlineClassifier'


def load_expected(path: str, task: str) -> dict:
    """An ``--expected`` file, its keys checked before any work."""
    try:
        with open(path) as f:
            expected = json.load(f)
    except (OSError, ValueError) as err:
        raise SystemExit(f'error: --expected {path}: {err}') from None
    scores = expected.get('scores')
    tol = expected.get('tolerance')
    if not isinstance(scores, dict) or not scores or not all(
            isinstance(v, (int, float)) for v in scores.values()):
        raise SystemExit(f'error: --expected {path}: "scores" must map each '
                         'condition (corruption) to a number')
    if not isinstance(tol, (int, float)) or tol < 0:
        raise SystemExit(f'error: --expected {path}: "tolerance" must be a '
                         'number >= 0 (points of the score)')
    if task == 'classification' and expected.get('metric') not in ('acc',
                                                                    'err'):
        raise SystemExit(f'error: --expected {path}: "metric" must be "acc" '
                         'or "err"')
    return expected


# ------------------------------------------------------------------ 1. data


def acdc_tree(cfg, expected: Optional[dict]) -> List[str]:
    """Problems of the ACDC tree the config reads, one sentence each (what
    it found is printed when all holds)."""
    ds = cfg.test_dataloader.dataset
    root = ds.data_root
    conditions = ds.get('conditions', ('fog', 'night', 'rain', 'snow'))
    conditions = (conditions, ) if isinstance(conditions, str) else conditions
    split = ds.get('split', 'train')
    img_dir, ann_dir = ds.get('img_dir', 'rgb_anon'), ds.get('ann_dir', 'gt')
    img_suffix = ds.get('img_suffix', '_rgb_anon.png')
    seg_suffix = ds.get('seg_map_suffix', '_gt_labelTrainIds.png')
    count = (expected or {}).get('images_per_condition', ACDC_IMAGES)
    if not osp.isdir(root):
        return [f'the ACDC root {root} does not exist (--data-root DIR; '
                'docs/data.md#acdc)']
    problems, found = [], []
    for cond in conditions:
        img_root = osp.join(root, img_dir, cond, split)
        if not osp.isdir(img_root):
            problems.append(f'condition {cond}: the folder {img_root} does '
                            f'not exist (unzip rgb_anon_trainvaltest.zip into'
                            f' {root}: docs/data.md#acdc)')
            continue
        images = sorted(osp.join(d, n) for d, _, names in os.walk(img_root)
                        for n in names if n.endswith(img_suffix))
        found.append(f'{cond} {len(images)}')
        if len(images) != count:
            problems.append(
                f'condition {cond}: {len(images)} *{img_suffix} images under '
                f'{img_root}, the protocol reads {count} (ACDC\'s {split} '
                'split unpacked whole?)')
        labels = [osp.join(root, ann_dir, cond, split,
                           osp.relpath(p, img_root)[:-len(img_suffix)] +
                           seg_suffix) for p in images]
        missing = [p for p in labels if not osp.isfile(p)]
        if missing:
            problems.append(
                f'condition {cond}: {len(missing)} of {len(images)} images '
                f'have no label file, the first {missing[0]} (unzip '
                f'gt_trainval.zip into {root})')
        # every label decoded: one wrong file would bias a stage's mIoU
        bad = [msg for msg in map(label_problem, labels) if msg]
        problems += bad[:3]
        if len(bad) > 3:
            problems.append(f'condition {cond}: {len(bad) - 3} more label '
                            'files like these')
    if found and not problems:
        print(f'  {root}: images (each with its train-id label): '
              + ', '.join(found))
    return problems


def label_problem(path: str) -> Optional[str]:
    """Why the label file ``path`` is not in train ids (it starts with the
    path), or None (also None for a missing file: counted elsewhere)."""
    from PIL import Image
    if not osp.isfile(path):
        return None
    with Image.open(path) as image:
        mode = image.mode
        array = np.asarray(image)
    if array.ndim == 3:
        return (f'{path} is a colour image (mode {mode}), not train ids: the '
                'stream reads one channel of values 0..18 and 255 '
                '(*_gt_labelTrainIds.png, not *_gt_labelColor.png)')
    values = np.unique(array)
    bad = values[(values >= ACDC_CLASSES) & (values != 255)]
    if bad.size:
        return (f'{path} has values {bad[:8].tolist()} outside the 19 train '
                'ids (0..18, 255 ignored): Cityscapes\' raw label ids '
                '(*_gt_labelIds.png) or another encoding, not train ids')
    return None


def cls_tree(cfg, benchmark: Optional[str],
             expected: Optional[dict]) -> List[str]:
    """Problems of the ImageNet-C / CIFAR-C tree the config reads."""
    ds = cfg.test_dataloader.dataset
    cset = ds.corruption_set
    root, kind = cset.data_root, cset.type
    severity = int(cset.get('severity', 5))
    corruptions = ds.get('corruptions', CORRUPTIONS)
    classes, per = CLS_DATA.get(benchmark, (None, None))
    if expected is not None:
        classes = expected.get('classes', classes)
        per = expected.get('images_per_corruption', per)
    if not osp.isdir(root):
        return [f'the {kind} root {root} does not exist (--data-root DIR; '
                'docs/data.md)']
    problems, found = [], []
    if kind == 'CIFARC':
        labels_path = osp.join(root, 'labels.npy')
        if not osp.isfile(labels_path):
            return [f'{labels_path} does not exist (CIFAR-C\'s labels; '
                    'docs/data.md#cifar-10-c-cifar-100-c)']
        labels = np.load(labels_path)
        if per is not None and labels.shape != (5 * per, ):
            problems.append(f'{labels_path} has shape {labels.shape}, the '
                            f'release has ({5 * per},): 5 severities x {per}')
        if classes is not None and labels.size and (
                labels.min() < 0 or labels.max() >= classes):
            problems.append(f'{labels_path} has labels {labels.min()}.. '
                            f'{labels.max()}, the data set has {classes} '
                            'classes (CIFAR-10-C for CIFAR-100-C?)')
        for c in corruptions:
            path = osp.join(root, f'{c}.npy')
            if not osp.isfile(path):
                problems.append(f'corruption {c}: {path} does not exist')
                continue
            array = np.load(path, mmap_mode='r')  # the header, no pixels
            if array.dtype != np.uint8 or array.shape[1:] != (32, 32, 3) or \
                    array.shape[0] != labels.shape[0]:
                problems.append(f'corruption {c}: {path} is {array.dtype} '
                                f'{array.shape}, expected uint8 '
                                f'[{labels.shape[0]}, 32, 32, 3]')
            else:
                found.append(c)
    else:  # ImageNetC: <root>/<corruption>/<severity>/<wnid>/*
        from mmseg_stag.classification.data import IMAGE_EXTENSIONS
        for c in corruptions:
            folder = osp.join(root, c, str(severity))
            if not osp.isdir(folder):
                problems.append(f'corruption {c}: the folder {folder} does '
                                'not exist (docs/data.md#imagenet-c)')
                continue
            wnids = [e for e in os.scandir(folder) if e.is_dir()]
            n = sum(1 for w in wnids for e in os.scandir(w.path)
                    if e.name.lower().endswith(IMAGE_EXTENSIONS))
            if classes is not None and len(wnids) != classes:
                problems.append(f'corruption {c}: {len(wnids)} class folders'
                                f' in {folder}, ImageNet has {classes}')
            elif per is not None and n != per:
                problems.append(f'corruption {c}: {n} images in {folder}, '
                                f'the release has {per}')
            else:
                found.append(c)
    if found and not problems:
        print(f'  {root}: {len(found)} corruptions, each complete')
    return problems


# ------------------------------------------------------------ 2. checkpoint


def build_model(cfg):
    """The config's model as MMEngine's Runner builds it (its scope)."""
    from mmengine.registry import MODELS, DefaultScope
    model_cfg = dict(cfg.model)
    if cfg.get('data_preprocessor') is not None:
        model_cfg.setdefault('data_preprocessor', cfg.data_preprocessor)
    with DefaultScope.overwrite_default_scope(cfg.get('default_scope')):
        return MODELS.build(model_cfg)


def classifier_of(model, cfg, classification: bool) -> str:
    """The classifier's module name, as the checkpoint's keys spell it."""
    import torch.nn as nn
    head = (cfg.get('test_cfg') or {}).get('head_layer')
    if not classification:
        return head or 'decode_head.conv_seg'
    if head:
        return head
    linears = [n for n, m in model.network.named_modules()
               if isinstance(m, nn.Linear)]
    return linears[-1] if linears else ''


def checkpoint_problems(cfg, args, classes: Optional[int]) -> List[str]:
    """Problems of the checkpoint with the config's model, one sentence
    each (the strict loader's message lists the keys)."""
    path = args.checkpoint
    if not osp.isfile(path):
        return [f'checkpoint file not found: {path}']
    classification = is_classification(cfg)
    model = build_model(cfg)
    head = classifier_of(model, cfg, classification)
    own = (model.network if classification else model).state_dict()
    key = f'{head}.weight'
    problems = []
    if classes is not None and key in own and own[key].shape[0] != classes:
        problems.append(f'{args.config}: the config\'s classifier {key} has '
                        f'{own[key].shape[0]} classes, the data set '
                        f'{classes}')
    state, meta = None, {}
    if not path.endswith(('.npz', '.safetensors')):  # timm's own formats
        try:
            checkpoint = load_checkpoint_file(path, args.trust_pickle)
            state = extract_state_dict(checkpoint, path)
        except (RuntimeError, ValueError, OSError) as err:
            return problems + [str(err)]
        meta = checkpoint.get('meta') if 'state_dict' in checkpoint else {}
    if state is not None and key in own:
        if key not in state:
            problems.append(
                f'{path} has no classifier weight {key}'
                + ('' if classification else ': an NVlabs checkpoint not '
                   'converted? run tools/convert_nvlabs_segformer.py'))
        elif classes is not None and state[key].shape[0] != classes:
            problems.append(f'{path}: {key} has {state[key].shape[0]} '
                            f'classes, the data set has {classes}')
    if 'nvlabs' in osp.basename(args.config):
        meta = meta if isinstance(meta, dict) else {}
        if not (meta.get('converter') and meta.get('converted_from')):
            problems.append(
                f'{path} has no meta converter/converted_from: the *nvlabs* '
                'configs take NVlabs\' checkpoint after `python '
                'tools/convert_nvlabs_segformer.py SRC DST` (docs/'
                'checkpoints.md)')
    try:  # the loader tools/test.py uses, strict
        load_model_checkpoint(model, path, args.trust_pickle, head
                              if not classification else None)
    except (RuntimeError, ValueError, OSError) as err:
        if not any(key in p for p in problems):  # not said twice
            problems.append(str(err))
    if not problems:
        print(f'  {path}: loads strictly, classifier {key} '
              f'{tuple(own[key].shape) if key in own else ""}'
              + (f', converted from {meta.get("converted_from")}'
                 if isinstance(meta, dict) and meta.get('converter') else ''))
    return problems


# ---------------------------------------------------------------- 3. source


#: ``test_cfg`` keys of the adapting method, dropped with it for Source:
#: clean source data (EATA's), the step replayed as a CUDA graph (Source
#: has no step to replay: the wrapper refuses it) and its warm-up; the
#: method's own options (``test_cfg.method``: test-batch BN statistics
#: among them, Source keeps the running ones) go with the method
METHOD_ONLY = ('source_dataloader', 'cuda_graph', 'graph_warmup')
#: a fast preset's sibling of a faithful config: ``<stem>_bf16-graph.py``
#: (the step replayed as a CUDA graph) or ``<stem>_bf16.py`` (eager)
PRESET_NAME = re.compile(r'^(?P<stem>.+)_(?:bf16-graph|bf16)\.py$')


def source_cfg(cfg, args, corruptions) -> Config:
    """``cfg`` with Source as the method and the short stream."""
    cfg = copy.deepcopy(cfg)
    # the loop's options stay (a preset's precision is what is checked);
    # what belongs to the method goes with it (METHOD_ONLY)
    cfg.test_cfg.method = ConfigDict(type='source')
    for key in METHOD_ONLY:
        cfg.test_cfg.pop(key, None)
    ds = cfg.test_dataloader.dataset
    if is_classification(cfg):
        ds.corruptions = list(corruptions)
        ds.corruption_set.n_examples = args.images
    else:
        ds.rounds = 1  # Source does not adapt: round 1 is every round
    return cfg


def dropped_options(cfg) -> List[str]:
    """What the Source run drops of the config besides its method."""
    test_cfg = cfg.test_cfg
    dropped = []
    for key in METHOD_ONLY:
        value = test_cfg.get(key)
        if key == 'cuda_graph' and value:
            dropped.append('test_cfg.cuda_graph=True (Source has no step to '
                           'replay as a CUDA graph)')
        elif key != 'cuda_graph' and value is not None and value is not False:
            dropped.append(f'test_cfg.{key}')
    options = sorted(k for k in test_cfg.method if k != 'type')
    if options:
        dropped.append('test_cfg.method\'s ' + ', '.join(options))
    return dropped


def number_options(cfg) -> List[str]:
    """The options of ``cfg`` (kept for Source) that move its numbers away
    from the paper's float32 run, one phrase each."""
    test_cfg = cfg.test_cfg
    found = []
    precision = 'fp16' if test_cfg.get('fp16') else test_cfg.get(
        'mixed_precision')
    if precision:
        found.append({'bf16': 'bfloat16', 'fp16': 'float16'}.get(
            precision, str(precision)) + ' autocast')
    if test_cfg.get('tf32'):
        found.append('TF32 matmuls and convolutions')
    backbone = (cfg.model.get('backbone') or {}) if not is_classification(
        cfg) else {}
    if backbone.get('attention') == 'sdpa' or backbone.get(
            'type') == 'SDPAMixVisionTransformer':
        found.append('SDPA attention' + (
            ' on views of the tokens'
            if backbone.get('token_maps') == 'view' else ''))
    return found


def preset_sentence(cfg, reference: Optional[dict]) -> Optional[str]:
    """What a preset (or any option that moves Source's numbers) changes in
    the comparison, and the tolerance it is held to; None: nothing."""
    preset = cfg.test_cfg.get('preset')
    changes = number_options(cfg)
    if not (preset or changes):
        return None
    workers = cfg.test_dataloader.get('num_workers')
    what = ', '.join(changes) or 'no option that moves the numbers'
    text = (f'preset {preset}: ' if preset else 'speed options: ') + what
    if preset and workers:
        text += f' ({workers} loader workers: no effect on the numbers)'
    if reference is None:
        return text
    if reference['source'] == 'expected':
        return text + (' -- compared with --expected\'s numbers within its '
                       f'{reference["tolerance"]:.2f} points')
    if reference.get('tolerance') is None:  # classification: per subset
        return text + (' -- compared with the paper\'s Source (float32) '
                       'within each corruption\'s tolerance below (its '
                       'sampling error + 1 point): reduced precision moves '
                       'a score by a fraction of that')
    shift = (f', at most {BF16_SHIFT} point a condition on the demo\'s '
             'trained SegFormer' if changes else '')
    return text + (' -- compared with the paper\'s Source (float32) within '
                   f'{reference["tolerance"]:.1f} point: these move '
                   f'Source\'s mIoU by a fraction of that{shift}; a wrong '
                   'set-up by points (beyond it: check the float32 config '
                   'first)')


def faithful_config(config: str) -> Optional[str]:
    """The faithful sibling of a preset config (the name without
    ``_bf16`` / ``_bf16-graph``), if that file exists."""
    match = PRESET_NAME.match(osp.basename(config))
    path = match and osp.join(osp.dirname(config), match['stem'] + '.py')
    return path if path and osp.isfile(path) else None


def cuda_available() -> bool:
    import torch
    return torch.cuda.is_available()


def preset_refusal(cfg, args) -> Optional[str]:
    """Why a preset's Source run cannot run on this machine (no CUDA
    device), and how to check instead; None: it can run."""
    preset = cfg.test_cfg.get('preset')
    if not preset or cuda_available():
        return None
    faithful = faithful_config(args.config)
    words = ['python', 'tools/check_setup.py', faithful or
             'FAITHFUL_CONFIG', args.checkpoint]
    for flag, value in (('--data-root', args.data_root),
                        ('--expected', args.expected)):
        words += [flag, value] if value else []
    words += ['--trust-pickle'] if args.trust_pickle else []
    return (f'not run: test_cfg.preset=\'{preset}\' runs on a CUDA GPU '
            'only, and this machine has none (torch.cuda.is_available() is '
            'False). Run this check on the GPU machine, or check the faithful'
            ' config on this one (float32, the paper\'s precision; its Source '
            'pass of the B5 takes hours on a few CPU cores):\n'
            + ' '.join(map(shlex.quote, words))
            + (' (and those of your --cfg-options it needs)'
               if args.cfg_options else '')
            + ('' if faithful else '\n(FAITHFUL_CONFIG: the config this '
               'preset inherits, without its _bf16 / _bf16-graph suffix)'))


def run_source(cfg, args, work_dir: str, corruptions) -> Dict[str, float]:
    """Per condition (corruption), the Source score of the short stream."""
    from mmseg_stag.engine.report import read_results
    from mmseg_stag.engine.runs import prepare_config, run_test
    prepared = prepare_config(source_cfg(cfg, args, corruptions), work_dir,
                              args.config)
    run_test(prepared, args.checkpoint, args.trust_pickle)
    record = read_results(work_dir)
    if record['task'] == 'classification':
        details = record['details']
        return {c: v[details['table_metric']]
                for c, v in details['per_corruption'].items()}
    return {s['condition']: s['score'] for s in record['stages']}


def tolerance_of(reference: dict, name: str, images: int) -> float:
    """The tolerance of one condition: the reference's, or for the paper's
    classification numbers the subset's sampling error plus slack."""
    if reference.get('tolerance') is not None:
        return float(reference['tolerance'])
    p = reference['scores'][name] / 100.0
    return CLS_SLACK + CLS_SIGMAS * 100.0 * math.sqrt(p * (1 - p) / images)


def compare(scores, reference, images) -> List[str]:
    """Print ours beside the reference; return the conditions beyond."""
    print(f'  {"":16s} {"ours":>8s} {reference["source"]:>10s} '
          f'{"diff":>7s} {"tol":>6s}')
    beyond = []
    for name, want in reference['scores'].items():
        got = scores.get(name)
        if got is None:
            beyond.append(f'{name}: not in the run')
            continue
        tol = tolerance_of(reference, name, images)
        ok = abs(got - want) <= tol
        print(f'  {name:16s} {got:8.2f} {want:10.2f} {got - want:+7.2f} '
              f'{tol:6.2f}  {"ok" if ok else "BEYOND"}')
        if not ok:
            beyond.append(f'{name}: {got:.2f} vs {want:.2f} '
                          f'({got - want:+.2f}, tolerance {tol:.2f})')
    return beyond


def reference_of(classification: bool, setting: Optional[dict],
                 expected: Optional[dict], corruptions) -> Optional[dict]:
    """The numbers the Source run is held to (None: none published)."""
    if expected is not None:
        scores = expected['scores']
        if classification:
            scores = {c: scores[c] for c in corruptions if c in scores}
        return dict(scores=scores, tolerance=expected['tolerance'],
                    metric=expected.get('metric'),
                    source='expected')
    if not classification:
        if setting and setting['model'] == 'segformer-b5':  # the NVlabs B5
            return dict(scores=dict(PAPER_ACDC_SOURCE),
                        tolerance=ACDC_TOLERANCE, source='paper')
        return None
    if not setting or 'ecotta' in setting['method']:
        return None  # EcoTTA's network holds meta networks: not Source's
    found = PAPER_CLS_SOURCE.get((setting['benchmark'], setting['model']))
    if found is None:
        return None
    metric, row = found
    return dict(scores={c: row[CORRUPTIONS.index(c)] for c in corruptions},
                tolerance=None, metric=metric, source='paper')


def data_root_of(cfg) -> Tuple[str, str]:
    """The key of the config's test images and its value."""
    if is_classification(cfg):
        return ('test_dataloader.dataset.corruption_set.data_root',
                cfg.test_dataloader.dataset.corruption_set.data_root)
    return ('test_dataloader.dataset.data_root',
            cfg.test_dataloader.dataset.data_root)


def table_of(setting: Optional[dict]) -> Optional[str]:
    """The ``tools/reproduce.py`` table that runs a config's setting (None:
    no table of the paper has its row)."""
    if not setting:
        return None
    key = tuple(setting[k] for k in ('benchmark', 'scenario', 'model',
                                     'method'))
    if not any(row[:4] == key for row in PAPER_RESULTS):
        return None
    key = key[:3]
    name = '_'.join(key)
    return 'table9' if name == 'acdc_continual_segformer-b5' else name


def next_command(cfg, args) -> str:
    """The run of the config checked (its preset included) through
    ``tools/test.py`` in MMSeg's default work dir, and its table's runs
    through ``tools/reproduce.py``; each config named exists."""
    config = args.config
    if not osp.isfile(config):  # it was read: only a moved file lands here
        return 'the table\'s runs: docs/reproduce.md'
    key, data_root = data_root_of(cfg)
    stem = osp.splitext(osp.basename(config))[0]
    test = ['python', 'tools/test.py', config, args.checkpoint,
            '--cfg-options', f'{key}={data_root}']
    lines = [f'run this config (its work dir work_dirs/{stem}, tools/test.py'
             '\'s default):', '  ' + ' '.join(map(shlex.quote, test))]
    if args.cfg_options:
        lines.append('  (with those of your --cfg-options the run needs: '
                     'they are not repeated here)')
    table = table_of(setting_of(osp.basename(config)))
    if table is not None:
        words = ['python', 'tools/reproduce.py', table, '--checkpoint',
                 args.checkpoint, '--data-root', data_root]
        preset = cfg.test_cfg.get('preset')
        if preset:
            words += ['--preset', preset]
        lines += ['or every run of its table (each in work_dirs/<config '
                  'stem>, then the table; docs/reproduce.md):',
                  '  ' + ' '.join(map(shlex.quote, words))]
    return '\n'.join(lines)


def seconds(value: float) -> str:
    """A duration as a person reads it: ``4.2 s``, ``3 min 05 s``."""
    if value < 1:
        return f'{value:.2f} s'
    if value < 60:
        return f'{value:.1f} s'
    minutes, rest = divmod(int(round(value)), 60)
    if minutes < 60:
        return f'{minutes} min {rest:02d} s'
    return f'{minutes // 60} h {minutes % 60:02d} min'


def main(argv=None) -> int:
    args = parse_args(argv)
    cfg = load_cfg(args)
    classification = is_classification(cfg)
    task = 'classification' if classification else 'segmentation'
    expected = load_expected(args.expected, task) if args.expected else None
    setting = setting_of(osp.basename(args.config))
    corruptions = list(args.corruptions or DEFAULT_CORRUPTIONS)
    unknown = [c for c in corruptions if c not in CORRUPTIONS]
    if classification and unknown:
        raise SystemExit(f'error: --corruptions: unknown {unknown} (the 15: '
                         f'{", ".join(CORRUPTIONS)})')
    reference = reference_of(classification, setting, expected,
                             corruptions)
    if reference is not None:  # every condition run has its number
        if classification:
            run = corruptions
            metric = cfg.test_evaluator.get('table_metric', 'acc')
            if reference.get('metric') not in (None, metric):
                raise SystemExit(f'error: the reference is in '
                                 f'{reference["metric"]}, the config scores '
                                 f'{metric} (test_evaluator.table_metric)')
        else:
            run = cfg.test_dataloader.dataset.get(
                'conditions', ('fog', 'night', 'rain', 'snow'))
            run = [run] if isinstance(run, str) else list(run)
            reference['scores'] = {c: v for c, v in
                                   reference['scores'].items() if c in run}
        missing = [c for c in run if c not in reference['scores']]
        if missing:
            raise SystemExit(f'error: no reference number for {missing} in '
                             f'{args.expected or "the paper"}: give them in '
                             '--expected, or leave them out of the run')
    print(f'check_setup: {args.config}, {args.checkpoint} ({task})')
    started = time.perf_counter()
    verdicts, took = {}, {}

    def report(name, problems, since):
        verdicts[name] = 'FAIL' if problems else 'PASS'
        took[name] = time.perf_counter() - since
        print(f'[{verdicts[name]}] {name} ({seconds(took[name])})')
        for p in problems:
            print('  - ' + p.replace('\n', '\n    '))

    print('1. data tree')
    since = time.perf_counter()
    if classification:
        classes = (expected or {}).get('classes', CLS_DATA.get(
            (setting or {}).get('benchmark'), (None, ))[0])
        report('data', cls_tree(cfg, (setting or {}).get('benchmark'),
                                expected), since)
    else:
        classes = ACDC_CLASSES
        report('data', acdc_tree(cfg, expected), since)
    print('2. checkpoint')
    since = time.perf_counter()
    report('checkpoint', checkpoint_problems(cfg, args, classes), since)
    print('3. source' + (' on round 1' if not classification else
                         f' on {", ".join(corruptions)} ({args.images} '
                         'images each)'))
    since = time.perf_counter()
    method = cfg.test_cfg.get('method', {}).get('type', '?')
    dropped = dropped_options(cfg)
    if method != 'source' or dropped:
        print(f'  Source in place of {method}' + (
            '; dropped with it: ' + '; '.join(dropped) if dropped else ''))
    sentence = preset_sentence(source_cfg(cfg, args, corruptions),
                               reference)
    if sentence:
        print('  ' + sentence)
    refusal = preset_refusal(cfg, args)
    if args.no_run:
        verdicts['source'] = 'SKIPPED'
        print('[SKIPPED] source: --no-run')
    elif refusal:
        report('source', [refusal], since)
    elif 'FAIL' in verdicts.values():
        verdicts['source'] = 'SKIPPED'
        print('[SKIPPED] source: fix the failures above first')
    else:
        work_dir = args.work_dir or osp.join(
            'work_dirs', 'check_setup', osp.splitext(
                osp.basename(args.config))[0])
        try:
            scores = run_source(cfg, args, work_dir, corruptions)
        except (ValueError, FileNotFoundError) as err:  # the run's refusals
            report('source', [f'the Source run stopped: {err}'], since)
        else:
            if reference is None:
                verdicts['source'] = 'NOT COMPARED'
                took['source'] = time.perf_counter() - since
                print('  ' + ', '.join(f'{k} {v:.2f}'
                                       for k, v in scores.items()))
                print(f'[NOT COMPARED] source ({seconds(took["source"])}): '
                      'the paper publishes no Source numbers of this '
                      'config\'s model; give --expected FILE')
            else:
                report('source', compare(scores, reference, args.images),
                       since)
    failed = [k for k, v in verdicts.items() if v == 'FAIL']
    print('Verdict: ' + ('FAIL (' + ', '.join(failed) + ')' if failed
                         else 'PASS') + ' -- ' + ', '.join(
                             f'{k} {v}' for k, v in verdicts.items()))
    print(f'Took {seconds(time.perf_counter() - started)}: ' + ', '.join(
        f'{k} {seconds(v)}' for k, v in took.items()))
    if failed == ['source'] and refusal:
        print('Next: the check on the GPU machine, or the faithful config\'s '
              'on this one (the command above).')
    elif failed:
        print('Next: fix each failure above (docs/faq.md#checking-the-set-up'
              '), then run this command again.')
    else:
        print('Next: ' + next_command(cfg, args))
    return 1 if failed else 0


if __name__ == '__main__':
    sys.exit(main())
