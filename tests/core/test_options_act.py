"""Every option of every registered method acts or is refused, by
behaviour: set away from its default on a tiny model, over three tiny
batches (the third in a new stage), it either changes what the method does
(the model's weights or its predictions) or is refused with a
``ValueError`` naming it. tests/test_options_are_read.py checks, by reading
the source, that an option is stored somewhere; this checks that it does
something. Options that act only where the tiny stream cannot reach are
in :data:`ACTS_ELSEWHERE`, each with why; every option of every method's
constructor must be in one of the two tables (a new one fails here).

Also: every shipped config's method builds, and carries clean source data
exactly when the method reads it (the loop refuses it otherwise)."""
import glob
import inspect
import os.path as osp

import pytest
import torch
import torch.nn as nn
from mmengine.config import Config
from tiny_nets import TinySegNet

import mmseg_stag.classification  # noqa: F401  (registers its methods)
import mmseg_stag.segmentation  # noqa: F401
from mmseg_stag.classification import WideResNet
from mmseg_stag.classification.ecotta_network import attach_meta_networks
from mmseg_stag.core import METHODS, Batch, HeadProbe, TaskAdapter
from mmseg_stag.core.registry import build_method
from mmseg_stag.segmentation.online_task import OWN_METHODS

REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
STAG = dict(beta0=50.0, gamma=5.0)


def seeded(kind):
    """A ``kind`` (TinySegNet or TinyClassifier), seeded, with BN statistics
    that are not the identity and a confident classifier."""
    torch.manual_seed(0)
    model = kind()
    with torch.no_grad():
        model.body[1].running_mean.uniform_(-0.5, 0.5)
        model.body[1].running_var.uniform_(0.5, 2.0)
        model.classifier.weight.mul_(8.0)
    return model.eval()


def tiny_net():
    return seeded(TinySegNet), TaskAdapter(
        HeadProbe('classifier', prediction_kind='per_pixel')), (3, 8, 8)


class TinyClassifier(TinySegNet):
    """TinySegNet pooled into a confident linear classifier (per sample)."""

    def __init__(self, num_classes=5, dim=8):
        super().__init__(num_classes, dim)
        self.classifier = nn.Linear(dim, num_classes)

    def forward(self, x):
        return self.classifier(self.body(x).mean((2, 3)))


def tiny_classifier():
    return seeded(TinyClassifier), TaskAdapter(HeadProbe('classifier')), (
        3, 8, 8)


def tiny_wrn():
    """WRN-16-1 with EcoTTA's meta networks (K = 4)."""
    torch.manual_seed(0)
    model = WideResNet(depth=16, widen_factor=1, num_classes=10)
    with torch.no_grad():
        model.fc.weight.mul_(10.0)
    attach_meta_networks(model, r'block\d\.layer\.\d+', [1, 1, 2, 2],
                         (3, 16, 16))
    return model.train(), TaskAdapter(HeadProbe('fc')), (3, 16, 16)


#: per method: the model, the options every run of it has (so that what
#: an option acts on happens in the tiny stream: SAR's recovery, a filter
#: that keeps part of a batch), and each option's non-default value
METHOD_CASES = {
    'source': (tiny_net, {}, {
        'bn_batch_stats': True,
        'stag': STAG,  # refused: nothing to update
        'optimizer': dict(type='SGD', lr=0.1),  # refused
        'trainable': dict(kind='all'),  # refused
        'stage_restart': ('optimizer', ),  # refused
    }),
    'bn_adapt': (tiny_net, {}, {
        'bn_batch_stats': False,  # refused: that is Source
        'stag': STAG,
        'optimizer': dict(type='SGD', lr=0.1),  # refused without stag
        'trainable': dict(kind='all'),  # refused without stag
        'stage_restart': ('optimizer', ),  # refused without stag
    }),
    'tent': (tiny_net, {}, {
        'loss': 'pseudo_ce',
        'align_corners': True,  # refused but with pseudo_ce_fullres
    }),
    # a stateful optimizer: a fresh one per stage differs
    # a stateful optimizer (a fresh one per stage differs); a redundancy
    # margin that keeps pixels after the first batch
    'eata': (tiny_net, dict(d_margin=0.5, optimizer=dict(
        type='SGD', lr=0.01, momentum=0.9)), {
        'entropy_margin': 0.2,
        'd_margin': 0.9,
        'fisher_alpha': 0.0,
    }),
    'sar': (tiny_net, {}, {
        'entropy_margin': 0.2,
        'rho': 0.5,
        'recovery_threshold': 0.5,
        'exclude_regex': r'body\.1',
    }),
    'deyo': (tiny_net, {}, {
        'deyo_margin': 0.3,
        'reweight_margin': 0.2,
        'plpd_threshold': 0.0,
        'patch_len': 2,
        'reweight_ent': 0.0,
        'reweight_plpd': 0.0,
        'exclude_regex': r'body\.1',
    }),
    # ap=0: the teacher's plain prediction unless always_augment or ap
    'cotta': (tiny_classifier, dict(num_augs=2, ap=0.0), {
        'ema_momentum': 0.5,
        'restore_prob': 0.5,
        'ap': 1.0,
        'num_augs': 4,
        'always_augment': True,
        'augment': dict(gaussian_std=0.5),
        'loss': 'entropy',
    }),
    'ecotta': (tiny_wrn, {}, {
        'reg_weight': 5.0,
        'entropy_margin': 0.9,
    }),
}

#: ``{(method, option): options}`` of both runs an option is compared by,
#: beyond the method's: where it acts (CoTTA's views: when it augments)
OPTION_BASE = {('cotta', 'num_augs'): dict(always_augment=True),
               # ap=1: always unsure, the teacher is the views' mean (with
               # ap=0 the views are drawn, as the authors do, and unused)
               ('cotta', 'augment'): dict(ap=1.0)}

#: the base options (:class:`BaseMethod`), for every method with a loss
BASE_CASES = {
    'stag': STAG,
    'optimizer': dict(type='SGD', lr=0.5),
    'trainable': dict(kind='all'),
    'trainable.norm_types': dict(kind='norm_affine', norm_types=('GN', )),
    'trainable.name_regex': dict(kind='norm_affine', name_regex=r'body\.1'),
    'trainable.norm_types+all': dict(kind='all', norm_types=('BN', )),
    'stage_restart': ('optimizer', ),
    'bn_batch_stats': True,
}

#: ``{(method, option): why}``: options that act only in what the tiny
#: stream lacks (each acts, or is refused, where that is tested)
ACTS_ELSEWHERE = {
    ('tent', 'loss=pseudo_ce_fullres'):
        "its loss is at each image's original size: it needs an MMSeg "
        "segmentor's data samples (tests/segmentation)",
    ('sar', 'momentum_step_on_empty'):
        'acts only on a batch with no reliable sample; tests/core/methods/'
        'test_sar.py steps on one',
    ('cotta', 'restore_on_device'):
        'on the CPU it draws the restore mask as the host path does: it '
        'acts on a CUDA device (tests/core/methods/test_cotta.py checks its '
        'draw)',
    ('sar', 'recovery_restores_optimizer'):
        'acts only at a recovery with a step after it: tests/core/methods/'
        'test_sar.py',
    ('sar', 'recovery_clears_ema'):
        'acts only at a recovery followed by one that the kept EMA alone '
        'triggers: tests/core/methods/test_sar.py',
    ('hybrid_tta', '*'):
        'Hybrid-TTA attaches its modules to an MMSeg SegFormer (MiT): no '
        'tiny pure-PyTorch model; its options act in tests/segmentation/'
        'methods/test_hybrid_tta.py',
    ('cotta (segmentation)', '*'):
        "segmentation CoTTA's views are MMSeg test-time pipelines of an "
        'EncoderDecoder: tests/segmentation/methods',
}

#: options of the method or its bases not varied above, by why
NOT_OPTIONS = {'self'}


def constructor_options(cls):
    """The keyword options of ``cls`` and its bases in the package."""
    names = set()
    for klass in inspect.getmro(cls):
        if (klass.__module__ or '').startswith('mmseg_stag') and \
                '__init__' in vars(klass):
            names |= {n for n, p in inspect.signature(
                klass.__init__).parameters.items()
                if p.kind is p.POSITIONAL_OR_KEYWORD} - NOT_OPTIONS
    return names


def cases(name):
    make, base, own = METHOD_CASES[name]
    options = dict(own)
    if name not in ('source', 'bn_adapt'):
        options.update(BASE_CASES)
        if METHODS.get(name).default_trainable.get('kind') == 'all':
            options['trainable'] = dict(kind='norm_affine')
    return make, base, options


def option_kwargs(option, value):
    return {option.split('.')[0].split('+')[0]: value}


def run(name, make, options):
    """Build, configure and step three batches (the third a new stage):
    the predictions and every weight after."""
    method = build_method(dict(options, type=name))
    model, adapter, shape = make()
    method.configure(model, adapter)
    g = torch.Generator().manual_seed(1)
    if method.needs_source_data:
        method.fit_source([Batch(torch.randn(4, *shape, generator=g))])
    predictions = []
    for k, stage in enumerate((0, 0, 1)):
        method.start_stage(stage)
        torch.manual_seed(10 + k)  # the methods' own draws, alike per run
        x = torch.randn(4, *shape, generator=g) * (1 + k)
        with torch.set_grad_enabled(method.has_loss):
            prediction, _ = method.adapt(Batch(x))
        predictions.append(prediction.value.detach().clone())
    weights = {k: v.detach().clone() for k, v in model.state_dict().items()}
    return predictions, weights


def same(a, b):
    (pa, wa), (pb, wb) = a, b
    return all(torch.equal(x, y) for x, y in zip(pa, pb)) and \
        wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


def test_every_option_is_in_a_table():
    """A method's new option fails here until it is varied below or its
    reason to act only elsewhere is written in ACTS_ELSEWHERE."""
    assert set(METHODS.module_dict) == set(METHOD_CASES) | {'hybrid_tta'}
    assert set(OWN_METHODS) == {'cotta'}
    for name in METHOD_CASES:
        _, _, options = cases(name)
        varied = {o.split('.')[0].split('+')[0] for o in options}
        elsewhere = {o.split('=')[0] for m, o in ACTS_ELSEWHERE
                     if m == name}
        missing = constructor_options(METHODS.get(name)) - varied - elsewhere
        assert not missing, f'{name}: options in no table: {missing}'


@pytest.mark.parametrize('name', sorted(METHOD_CASES))
def test_every_option_acts_or_is_refused(name):
    make, base, options = cases(name)
    references = {}
    inert = []
    for option, value in options.items():
        key = option.split('.')[-1].split('+')[0]
        extra = OPTION_BASE.get((name, option), {})
        if tuple(extra) not in references:
            references[tuple(extra)] = run(name, make, dict(base, **extra))
        reference = references[tuple(extra)]
        try:
            changed = not same(run(name, make, dict(
                base, **extra, **option_kwargs(option, value))), reference)
        except ValueError as err:
            assert key in str(err) or option.split('.')[0] in str(err), (
                f'{name} {option}={value!r} refused without naming it: '
                f'{err}')
            continue
        if not changed:
            inert.append(f'{option}={value!r}')
    assert not inert, (f'{name}: accepted, and changed nothing over three '
                       f'steps: {inert}. Make it act or refuse it with a '
                       'ValueError naming it (or, if it acts only where '
                       'this stream cannot reach, say why in '
                       'ACTS_ELSEWHERE)')


def test_trainable_norm_types_with_kind_all_is_refused():
    for name in ('tent', 'bn_adapt'):
        extra = dict(stag=STAG) if name == 'bn_adapt' else {}
        with pytest.raises(ValueError, match="norm_types.*kind='all'"):
            build_method(dict(type=name, trainable=dict(
                kind='all', norm_types=('BN', )), **extra))


@pytest.mark.parametrize('name', ['source', 'bn_adapt'])
def test_options_without_an_update_are_refused(name):
    """What TENT refuses, a method that never updates refuses too: an
    optimizer or trainable it has no use for (the issue's example)."""
    for option, value in (('optimizer', dict(type='NoSuchOptimizer')),
                          ('trainable', dict(kind='typo'))):
        with pytest.raises(ValueError, match=f'its {option} option'):
            build_method({'type': name, option: value})
        with pytest.raises(ValueError, match=option):
            build_method({'type': 'tent', option: value})
    # BN Adapt + STAG updates: its optimizer and trainable are TENT's
    if name == 'bn_adapt':
        with pytest.raises(ValueError, match='optimizer=.*NoSuchOptimizer'):
            build_method(dict(type=name, stag=STAG,
                              optimizer=dict(type='NoSuchOptimizer')))
        with pytest.raises(ValueError, match="trainable kind.*'typo'"):
            build_method(dict(type=name, stag=STAG,
                              trainable=dict(kind='typo')))


def shipped_method_configs():
    paths = sorted(glob.glob(osp.join(REPO, 'configs', '**', '*.py'),
                             recursive=True))
    return [p for p in paths if f'{osp.sep}_base_{osp.sep}' not in p]


def test_every_shipped_config_builds_its_method():
    """Every config's method builds (its options accepted), and has clean
    source images exactly when the method reads them."""
    built = 0
    for path in shipped_method_configs():
        cfg = Config.fromfile(path)
        test_cfg = cfg.get('test_cfg') or {}
        if 'method' not in test_cfg:
            continue
        method_cfg = test_cfg['method'].to_dict()
        own = OWN_METHODS.get(method_cfg['type'])
        if own is not None and 'cls' not in osp.relpath(path, REPO):
            method_cfg['type'] = own  # the segmentation task's own
        rel = osp.relpath(path, REPO)
        method = build_method(method_cfg)
        assert bool(test_cfg.get('source_dataloader')) == \
            method.needs_source_data, rel
        built += 1
    assert built >= 80
