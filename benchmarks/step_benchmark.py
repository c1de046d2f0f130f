"""The step benchmark (``tools/benchmark.py``, ``tools/gpu_check.py``):
interleaved steps of a baseline and of baseline + STAG, each on its own
model copy and the same input."""
import contextlib
import copy
import functools
import os.path as osp
import statistics
import types

import torch
import torch.nn as nn

from .meters import PassCounter, PeakMemory, SavedForBackward, StepTimer

SEG_TENT = 'configs/stag_acdc/segformer_mit-b5_acdc-continual_tent.py'
#: SegFormers: (config, relative to the repository; backbone overrides;
#: the head's input channels, None: the config's)
SEG_MODELS = {
    'b0': (SEG_TENT, dict(embed_dims=32, num_layers=[2, 2, 2, 2]),
           [32, 64, 160, 256]),
    'b5': (SEG_TENT, {}, None),
    'b5-nvlabs': (
        'configs/stag_acdc/segformer_mit-b5-nvlabs_acdc-continual_tent.py',
        {}, None),
}
#: ImageNet classifiers: (MMSeg backbone config, feature dimension)
IMAGENET_MODELS = {
    'resnet50': (dict(type='ResNet', depth=50, out_indices=(3, ),
                      style='pytorch', norm_cfg=dict(type='BN')), 2048),
    'vit-b16': (dict(type='VisionTransformer', img_size=224, patch_size=16,
                     embed_dims=768, num_layers=12, num_heads=12,
                     mlp_ratio=4, out_indices=(11, ), with_cls_token=True,
                     output_cls_token=True, final_norm=True,
                     norm_cfg=dict(type='LN', eps=1e-6)), 768),
}
#: continual CIFAR-C's WideResNets, 32x32 (EcoTTA's memory claim)
CIFAR_MODELS = {'wrn-40-2': dict(type='WRN40_2_AugMix'),
                'wrn-28-10': dict(type='WRN28_10_Standard')}
#: the paper's setting (Table appendix_hp) whose beta0/gamma +STAG uses
STAG_SETTING = {
    'seg': ('acdc', 'continual', 'segformer-b5'),
    'resnet50': ('imagenet-c', 'mild', 'resnet50-bn'),
    'vit-b16': ('imagenet-c', 'mild', 'vit-b16'),
    'wrn-40-2': ('cifar100-c', 'continual', 'wrn-40-2'),
    'wrn-28-10': ('cifar10-c', 'continual', 'wrn-28-10'),
}
#: the +STAG/baseline ratios reported: name -> the measure compared
STAG_RATIOS = {'stag_time_ratio': 'seconds', 'stag_memory_ratio': 'peak_mb',
               'stag_saved_ratio': 'saved_mb'}
#: TENT as CoTTA's code runs it (two forwards), its speed reference
REFERENCE = 'tent two-forward reference'
#: segmentation CoTTA's teacher views: the ACDC config's ScaleFlipViews
#: (its ratios and flips) at ``--size``
SEG_VIEWS = 'configs/_base_/datasets/acdc_continual_views.py'
#: the paper's row of a method whose name there differs
PAPER_ROW = {'ecotta': 'ecotta-k4', 'cotta_fast': 'cotta',
             'cotta_graph': 'cotta', 'tent_graph': 'tent'}
#: the shipped SegFormer-B5 configs (the paper's, NVlabs head) whose
#: ``test_cfg.method`` the segmentation arms run, by method (their fast
#: presets add ``_bf16-graph``: the same method for TENT, CoTTA's with
#: ``restore_on_device`` and ``batch_views``, see ``cotta_graph``)
SEG_CONFIG = ('configs/stag_acdc/'
              'segformer_mit-b5-nvlabs_acdc-continual_{}.py')
#: ACDC's images (W, H): the ``ori_shape`` of a segmentation batch's
#: metainfo, where the full-size losses are computed (TENT's
#: ``pseudo_ce_fullres``, CoTTA's); the input is ``--size``, as the ACDC
#: pipeline resizes 1920x1080 to 960x540
ACDC_SIZE = (1920, 1080)
SGD = dict(type='SGD', lr=0.00025, momentum=0.9)
ADAM = dict(type='Adam', lr=1e-3, betas=(0.9, 0.999))
#: the arms whose every step goes through ``CUDAGraphStep`` (the whole
#: step replayed as a CUDA graph; a CUDA device only), built before the
#: method is configured, as the loop's ``test_cfg.cuda_graph=True`` does
GRAPHED = ('tent_graph', 'cotta_graph')
#: the eager steps before a capture (the loop's ``test_cfg.graph_warmup``)
GRAPH_WARMUP = 2
#: the baselines' settings (their authors' defaults), per kind of model
BASELINES = {
    # the shipped configs' methods (TENT: cross-entropy on its labels with
    # the logits upsampled to ori_shape, Adam 7.5e-6)
    'seg': {'tent': SEG_CONFIG.format('tent'),
            'bn_adapt': SEG_CONFIG.format('bn-adapt'),
            # the whole step replayed as a CUDA graph (GRAPHED): the
            # method of the TENT preset (_bf16-graph)
            'tent_graph': SEG_CONFIG.format('tent'),
            'hybrid_tta': dict(type='hybrid_tta'),
            # the ACDC config's (Adam 7.5e-6, ap 0.69, restore 0.01)
            'cotta': SEG_CONFIG.format('cotta'),
            # the same with its GPU options: the restore mask drawn on the
            # device, a scale's two views in one teacher pass
            'cotta_fast': (SEG_CONFIG.format('cotta'),
                           dict(restore_on_device=True, batch_views=True)),
            # and its whole step, teacher views included, as a CUDA graph
            # (GRAPHED): the method of the CoTTA preset (_bf16-graph)
            'cotta_graph': (SEG_CONFIG.format('cotta'),
                            dict(restore_on_device=True, batch_views=True))},
    'cls': {'tent': dict(type='tent', optimizer=SGD),
            'tent_graph': dict(type='tent', optimizer=SGD),
            # random weights: EATA's filters would reject every sample
            'eata': dict(type='eata', entropy_margin=1.0, d_margin=2.0)},
    'cifar': {'tent': dict(type='tent', optimizer=ADAM),
              'cotta': dict(type='cotta', ap=0.72, optimizer=ADAM),
              'ecotta': dict(type='ecotta')},
}


class BackboneClassifier(nn.Module):
    """An MMSeg backbone, global pooling (or the class token) and a linear
    classifier ``fc``: the ResNet-50 / ViT-B/16 ImageNet architectures."""

    def __init__(self, backbone: dict, feature_dim: int,
                 num_classes: int = 1000):
        super().__init__()
        from mmseg.registry import MODELS
        self.backbone = MODELS.build(dict(backbone, _scope_='mmseg'))
        self.fc = nn.Linear(feature_dim, num_classes)

    def forward(self, x):
        out = self.backbone(x)[-1]
        if isinstance(out, (list, tuple)):  # ViT: [patch map, class token]
            return self.fc(out[1])
        return self.fc(out.mean((2, 3)))


def build_model(name, seed=0, root='.'):
    """The model ``name``, seeded random weights, in eval mode: a segmentor
    (its config under ``root``) or an ``OnlineClassifier``."""
    from mmengine.config import Config
    from mmengine.registry import init_default_scope
    from mmseg.registry import MODELS

    from mmseg_stag.classification import OnlineClassifier
    init_default_scope('mmseg')
    torch.manual_seed(seed)
    if name in IMAGENET_MODELS or name in CIFAR_MODELS:
        network = dict(CIFAR_MODELS[name]) if name in CIFAR_MODELS else \
            dict(type=BackboneClassifier, backbone=IMAGENET_MODELS[name][0],
                 feature_dim=IMAGENET_MODELS[name][1])
        return OnlineClassifier(dict(network, _scope_='mmseg_stag')).eval()
    config, backbone, in_channels = SEG_MODELS[name]
    cfg = Config.fromfile(osp.join(root, config))
    cfg.model.backbone.update(backbone)
    if in_channels:
        cfg.model.decode_head.in_channels = in_channels
    return MODELS.build(cfg.model).eval()


def original_size(args):
    """``(W, H)`` of a segmentation batch's ``ori_shape``: ``args.ori_size``
    where set, else ACDC's 1920x1080."""
    return tuple(getattr(args, 'ori_size', None) or ACDC_SIZE)


def random_batch(kind, args):
    """A loader's batch of random uint8 images: one ``--size`` image whose
    metainfo's ``ori_shape`` is :func:`original_size` (segmentation, as the
    ACDC pipeline gives it), else ``--batch-size`` of ``--cls-size``
    (CIFAR: 32)."""
    if kind == 'seg':
        from mmseg.structures import SegDataSample
        width, height = args.size
        ori_w, ori_h = original_size(args)
        meta = dict(ori_shape=(ori_h, ori_w), img_shape=(height, width),
                    pad_shape=(height, width), padding_size=[0, 0, 0, 0])
        return dict(inputs=[torch.randint(0, 256, (3, height, width),
                                          dtype=torch.uint8)],
                    data_samples=[SegDataSample(metainfo=meta)])
    from mmengine.structures import BaseDataElement
    size = args.cls_size if kind == 'cls' else 32
    return dict(inputs=torch.randint(0, 256, (args.batch_size, 3, size, size),
                                     dtype=torch.uint8),
                data_samples=[BaseDataElement()
                              for _ in range(args.batch_size)])


def method_settings(entry, root='.'):
    """A :data:`BASELINES` entry as a method's settings: a dict as it is,
    a config's ``test_cfg.method`` (its path), or such a path with
    overrides."""
    from mmengine.config import Config
    if isinstance(entry, dict):
        return entry
    path, overrides = (entry, {}) if isinstance(entry, str) else entry
    method = Config.fromfile(osp.join(root, path)).test_cfg.method
    return dict(method.to_dict(), **overrides)


def seg_views_cfg(root='.'):
    """The ``ScaleFlipViews`` of ``SEG_VIEWS`` (under ``root``), a dict."""
    from mmengine.config import Config
    return Config.fromfile(osp.join(root, SEG_VIEWS)).test_pipeline[-1] \
        .to_dict()


def view_batch(model, image, root='.', ori_shape=None):
    """The uint8 ``image`` (C, H, W) through the ACDC config's teacher
    views (``SEG_VIEWS``' ``ScaleFlipViews`` at the image's size), as the
    loop batches it: its main view is the unflipped one at ratio 1; its
    ``ori_shape`` (H, W) that of the image unless given."""
    from mmengine.dataset import pseudo_collate
    from mmseg.registry import TRANSFORMS

    from mmseg_stag.engine.online_task import build_task
    height, width = image.shape[-2:]
    views = TRANSFORMS.build(dict(seg_views_cfg(root), scale=(width, height),
                                  load_label=False))
    data = views(dict(img=image.permute(1, 2, 0).numpy(),
                      img_shape=(height, width),
                      ori_shape=tuple(ori_shape or (height, width)),
                      img_path=None))
    task = build_task(model, None, None)
    task.setup(types.SimpleNamespace(
        pipeline=types.SimpleNamespace(transforms=[views])))
    return task.batch(model, pseudo_collate([data]))


class BenchTask:
    """One model driven by its online task on one preprocessed batch:
    the baselines on fresh copies of its adapted module. ``args``:
    ``size``, ``cls_size``, ``batch_size``; ``root``: the repository."""

    def __init__(self, name, args, device, root='.'):
        from mmseg_stag.engine.online_task import build_task
        from mmseg_stag.paper.hparams import stag_hparams
        self.name = name
        self.kind = 'cls' if name in IMAGENET_MODELS else \
            'cifar' if name in CIFAR_MODELS else 'seg'
        model = build_model(name, root=root).to(device)
        self.online = build_task(model, None, None)
        self.online.setup(None)
        self.raw = random_batch(self.kind, args)  # the loader's batch
        self.batch = self.online.batch(model, self.raw)
        self.task_adapter = self.online.task_adapter
        self.probe = self.online.probe
        self.base = self.online.adapted_module(model)
        setting = STAG_SETTING[name if self.kind != 'seg' else 'seg']
        self.stag = {m: {k: float(v) for k, v in stag_hparams(
            *setting, PAPER_ROW.get(m, m)).items()}
                     for m in BASELINES[self.kind]}
        self.methods = {m: method_settings(cfg, root)
                        for m, cfg in BASELINES[self.kind].items()}
        # a segmentor is its adapted module: no second copy stays alive
        self.segmentor = model if self.kind == 'seg' else None
        self.root = root
        self.ori_size = original_size(args)
        self.batches = {}  # method -> its own batch (CoTTA's views)

    def batch_for(self, kind):
        """The batch ``kind`` steps on: segmentation CoTTA's has the
        teacher's views (built once, not timed), the others ``batch``."""
        if self.methods[kind]['type'] == 'cotta' and self.kind == 'seg':
            if kind not in self.batches:
                self.batches[kind] = view_batch(
                    self.segmentor, self.raw['inputs'][0], self.root,
                    ori_shape=self.ori_size[::-1])
            return self.batches[kind]
        return self.batch

    def config_of(self, kind):
        """Where ``kind``'s settings come from: the shipped config (with
        its overrides), or the settings themselves."""
        entry = BASELINES[self.kind][kind]
        if isinstance(entry, dict):
            return repr(entry)
        path, overrides = (entry, {}) if isinstance(entry, str) else entry
        return path + ''.join(f', {k}={v!r}' for k, v in overrides.items())

    def counted(self, model):
        """The module whose calls are forward passes: the decode head's
        classifier (MMSeg skips the head's hooks), or the network."""
        return self.probe.classifier(model) if self.kind == 'seg' else model

    def make_method(self, kind, stag, **overrides):
        """A configured method on a fresh copy of the model; ``overrides``
        replace keys of the method's settings (``optimizer=...``)."""
        from mmseg_stag.core import use_batch_statistics
        model = copy.deepcopy(self.base)
        if kind == 'ecotta':  # EcoTTA's network: K=4 meta networks
            from mmseg_stag.classification.ecotta_network import (
                ECOTTA_PRESETS, attach_meta_networks, find_blocks,
                preset_partition)
            blocks = ECOTTA_PRESETS['WideResNet'][0]
            attach_meta_networks(model, blocks, preset_partition(
                'WideResNet', len(find_blocks(model, blocks)), 4))
            model.to(self.batch.inputs.device)
        elif self.kind != 'seg':
            # the classification baselines normalise with batch statistics
            use_batch_statistics(model)
        # as the loop: the task builds (segmentation's CoTTA), wraps a
        # graphed arm's step (before configure: Adam made capturable),
        # configures and fits on source batches (EATA's Fisher, not timed)
        method = self.online.build_method(dict(self.methods[kind], stag=stag,
                                               **overrides))
        method.bench_step = None  # ours_step's step: eager
        if kind in GRAPHED:
            from mmseg_stag.core.methods.step_graph import CUDAGraphStep
            method.bench_step = CUDAGraphStep(method, warmup=GRAPH_WARMUP)
        self.online.configure(method, model)
        if method.needs_source_data:
            self.online.fit_source(method, [self.batch])
        return method, PassCounter(self.counted(model))

    def ours_step(self, method, batch=None):
        """One step of ``method`` as the loop runs it: eager, or through
        its ``CUDAGraphStep`` (a :data:`GRAPHED` arm)."""
        batch = self.batch if batch is None else batch
        step = getattr(method, 'bench_step', None)
        with torch.set_grad_enabled(method.has_loss):
            if step is None:
                return method.adapt(batch)[0]
            return method.adapt(batch, replay=step)[0]

    def two_forward_step(self, method):
        """CoTTA-style: predict under no_grad, then forward for the loss."""
        model = method.model
        with torch.no_grad():
            prediction = self.task_adapter.forward(model, self.batch).output
        with torch.enable_grad():
            loss = method.loss(self.batch,
                               self.task_adapter.forward(model, self.batch))
            method.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            method.optimizer.step()
        return prediction


def mixed_precision(dtype):
    """``torch.autocast`` with ``dtype`` (``'bf16'``/``'fp16'``) on the
    device in use; a null context for ``None``."""
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(
        device_type='cuda' if torch.cuda.is_available() else 'cpu',
        dtype=dict(bf16=torch.bfloat16, fp16=torch.float16)[dtype])


def measure(step, method, counter, dtype=None):
    f0 = counter.forwards
    with PeakMemory() as mem, SavedForBackward(method.model) as saved:
        with StepTimer() as timer, mixed_precision(dtype):
            step(method)
    return dict(seconds=timer.seconds, peak_mb=mem.delta_mb,
                saved_mb=saved.mb, activations_mb=saved.activations_mb,
                forwards=counter.forwards - f0, backwards=saved.count)


def interleave(arms, steps, warmup, dtype=None):
    """``arms``: name -> (step function, method, counter). Runs warm-up
    steps, then ``steps`` rounds of every arm in turn."""
    records = {name: [] for name in arms}
    for i in range(warmup + steps):
        order = list(arms) if i % 2 == 0 else list(reversed(arms))
        for name in order:
            rec = measure(*arms[name], dtype)
            if i >= warmup:
                records[name].append(rec)
    return records


def summary(records):
    medians = {k: statistics.median(r[k] for r in records)
               for k in ('seconds', 'peak_mb', 'saved_mb', 'activations_mb',
                         'forwards', 'backwards')}
    # the fastest step: least affected by other load (as ``timeit``)
    medians['seconds_min'] = min(r['seconds'] for r in records)
    return medians


def ratio_stats(a, b):
    """Median, min and max of the pairs' ratios ``b / a`` (``a > 0``)."""
    ratios = [y / x for x, y in zip(a, b) if x > 0]
    return dict(median=statistics.median(ratios), min=min(ratios),
                max=max(ratios)) if ratios else None


def arm_ratio(records, base, other, key):
    """:func:`ratio_stats` of ``key`` between two arms' steps."""
    return ratio_stats([r[key] for r in records[base]],
                       [r[key] for r in records[other]])


def error_text(err):
    """An error as a report shows it in place of a figure."""
    return f'{type(err).__name__}: {str(err)[:300]}'


def build_arms(task, kind, skip_reference):
    """``kind`` and ``kind+stag`` (and, for TENT, the two-forward
    reference unless ``skip_reference``): label -> (step, method,
    counter)."""
    arms = {}
    step = functools.partial(task.ours_step, batch=task.batch_for(kind))
    for label, stag in ((kind, None), (f'{kind}+stag', task.stag[kind])):
        arms[label] = (step, *task.make_method(kind, stag))
    if kind == 'tent' and not skip_reference:
        arms[REFERENCE] = (task.two_forward_step,
                           *task.make_method('tent', None))
    return arms


def compare_arms(kind, records):
    """Each arm's medians and steps, the +STAG/baseline ratios of the
    paired whole steps (STAG's share: no term is timed alone) and TENT's
    speed-up over the reference."""
    res = {label: dict(summary(recs), steps=recs)
           for label, recs in records.items()}
    for ratio, key in STAG_RATIOS.items():
        res[ratio] = arm_ratio(records, kind, f'{kind}+stag', key)
    if REFERENCE in records:
        res['speedup_vs_two_forward'] = arm_ratio(
            records, 'tent', REFERENCE, 'seconds')
    return res


def run_model(name, args, device, root='.'):
    """Every baseline of ``args.methods`` the model has against its +STAG
    arm: ``args.steps`` interleaved steps per arm after ``args.warmup``,
    printed and returned per baseline."""
    task = BenchTask(name, args, device, root)
    results = {}
    for kind in args.methods:
        if kind not in task.methods:
            continue
        arms = build_arms(task, kind, args.skip_reference)
        records = interleave(arms, args.steps, args.warmup,
                             args.mixed_precision)
        results[kind] = compare_arms(kind, records)
        print_table(name, kind, results[kind])
    if 'ecotta' in results:
        results['activations_mb'] = compare_activations(name, results)
    return results


def compare_activations(name, results):
    """EcoTTA's claim: the activations kept for backward per update, of
    every method run on the model, and their ratio to EcoTTA's."""
    acts = {kind: res[kind]['activations_mb']
            for kind, res in results.items()}
    print(f'\n{name}: activations kept for backward (largest graph of a '
          'step): ' + ', '.join(
              f'{k} {v:.1f} MB ({v / acts["ecotta"]:.1f}x EcoTTA)'
              for k, v in acts.items()))
    return acts


def print_table(name, kind, res):
    print(f'\n{name} {kind}')
    print(f"{'arm':32s} {'time s':>9s} {'min s':>9s} {'peak MB':>9s} "
          f"{'saved MB':>9s} {'act MB':>9s} {'fwd':>4s} {'bwd':>4s}")
    for label, r in res.items():
        if isinstance(r, dict) and 'peak_mb' in r:
            print(f"{label:32s} {r['seconds']:9.3f} {r['seconds_min']:9.3f} "
                  f"{r['peak_mb']:9.1f} {r['saved_mb']:9.1f} "
                  f"{r['activations_mb']:9.1f} "
                  f"{r['forwards']:4.0f} {r['backwards']:4.0f}")
    for key in (*STAG_RATIOS, 'speedup_vs_two_forward'):
        r = res.get(key)
        if r:
            print(f'{key:32s} {r["median"]:.4f} (min {r["min"]:.4f}, '
                  f'max {r["max"]:.4f})')
