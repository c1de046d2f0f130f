"""The paper's protocol beside its numbers (:mod:`mmseg_stag.paper.hparams`):
STAG's beta0/gamma chosen on the stream's first stage only (:func:`select`),
and the baselines' reference settings per classification benchmark, from
which ``tools/make_cls_configs.py`` writes ``configs/cls``."""
import os
import os.path as osp

from mmengine.config import Config

# ------------------------------------------------- the first-stage choice


def first_stage_cfg_options(cfg: Config, condition=None) -> dict:
    """``--cfg-options`` that keep the stream's first stage alone (ACDC:
    round-1 ``condition``; classification: the first corruption): the
    stream dataset's ``first_stage_options`` (its own keys) under
    ``test_dataloader.dataset.``."""
    dataset = cfg.test_dataloader.dataset
    options = stream_dataset_class(dataset).first_stage_options(dataset,
                                                                condition)
    return {f'test_dataloader.dataset.{k}': v for k, v in options.items()}


def images_per_stage_cfg_options(cfg: Config, num_images: int) -> dict:
    """``--cfg-options`` that keep the first ``num_images`` images of each
    stage, for either task: the stream dataset's
    ``images_per_stage_options`` under ``test_dataloader.dataset.``."""
    options = stream_dataset_class(
        cfg.test_dataloader.dataset).images_per_stage_options(num_images)
    return {f'test_dataloader.dataset.{k}': v for k, v in options.items()}


def stream_dataset_class(dataset_cfg: dict) -> type:
    """Return the class of the stream dataset ``dataset_cfg`` builds."""
    from mmengine.registry import DATASETS as ROOT

    from mmseg_stag.registry import DATASETS
    kind = dataset_cfg.get('type')
    cls = kind if isinstance(kind, type) else None
    for registry in () if cls else (DATASETS, ROOT):
        cls = registry.get(kind)
        if cls is None and '.' not in str(kind):
            cls = registry.get(f'mmseg.{kind}')  # MMSeg's scope
        if cls is not None:
            break
    if cls is None or not hasattr(cls, 'first_stage_options'):
        raise ValueError(
            f'test_dataloader.dataset.type={kind!r} is not a stream dataset '
            'that declares its first stage (ACDCContinualDataset, '
            'CorruptionStream)')
    return cls


def as_cli(options: dict) -> list:
    """``key=value`` words for ``--cfg-options`` (lists ``[a,b]``, tuples
    ``(a,b)``)."""
    def fmt(v):
        if isinstance(v, (list, tuple)):
            inner = ','.join(str(x) for x in v)
            return f'[{inner}]' if isinstance(v, list) else f'({inner})'
        return str(v)
    return [f'{k}={fmt(v)}' for k, v in options.items()]


def select(config, checkpoint: str, beta_grid, work_dir: str,
           gamma_grid=None, cfg_options=None, condition=None,
           log=print) -> dict:
    """Run each (beta0, gamma) of the grid on the first stage alone (in this
    process); return and write to ``<work_dir>/beta_selection.json`` the
    best (ties: the smaller beta0, then gamma) and the ``trials``
    (``FileNotFoundError`` for a missing config or checkpoint,
    ``ValueError`` for a config without STAG, before any run)."""
    from mmseg_stag.engine.report import read_results, write_json
    from mmseg_stag.engine.runs import prepare_config, run_test
    for name, path in (('config', config), ('checkpoint', checkpoint)):
        if isinstance(path, str) and not osp.isfile(path):
            raise FileNotFoundError(f'{name} file not found: {path}')
    cfg = config.copy() if isinstance(config, Config) \
        else Config.fromfile(config)
    cfg.merge_from_dict(dict(cfg_options or {}))
    if not cfg.get('test_cfg', {}).get('method', {}).get('stag'):
        raise ValueError(f'{config} has no test_cfg.method.stag (choose '
                         'beta0 on a STAG config)')
    cfg.merge_from_dict(first_stage_cfg_options(cfg, condition))
    os.makedirs(work_dir, exist_ok=True)
    gammas = gamma_grid or [cfg.test_cfg.method.stag.gamma]
    trials = []
    for beta0 in beta_grid:
        for gamma in gammas:
            trial = cfg.copy()
            trial.merge_from_dict({'test_cfg.method.stag.beta0': beta0,
                                   'test_cfg.method.stag.gamma': gamma})
            trial_dir = osp.join(work_dir, f'beta0_{beta0:g}_gamma_{gamma:g}')
            run_test(prepare_config(trial, trial_dir), checkpoint)
            score = read_results(trial_dir)['stages'][0]['score']
            trials.append(dict(beta0=beta0, gamma=gamma, score=score))
            if log:
                log(f'beta0={beta0:g}, gamma={gamma:g}: first-stage score '
                    f'{score:.2f}')
    best = max(trials, key=lambda t: (t['score'], -t['beta0'], -t['gamma']))
    result = dict(config=config if isinstance(config, str) else None,
                  checkpoint=checkpoint, beta0=best['beta0'],
                  gamma=best['gamma'], trials=trials)
    write_json(osp.join(work_dir, 'beta_selection.json'), result)
    return result


# ------------------------------------ the baselines' reference settings

#: EcoTTA rows of the table: the method ``ecotta`` on the network with K
#: meta networks (``_base_/models/<model>_ecotta-k<K>.py``), EATA's CIFAR
#: settings (SGD lr 5e-3, momentum 0.9, batch 64: EcoTTA's notebook points
#: to EATA's code).
ECOTTA_ROWS = {'ecotta-k4': 4, 'ecotta-k5': 5}
ECOTTA_BATCH = 64

#: the classification benchmarks and their folder under ``configs/cls``
BENCHMARK_DIRS = {'imagenet-c': 'imagenet-c', 'cifar10-c': 'cifar-c',
                  'cifar100-c': 'cifar-c'}
SCENARIO_BATCH = {'mild': 64, 'label-shift': 64, 'mixed': 64, 'bs1': 1,
                  'continual': 200}

#: Per-benchmark options of a baseline beyond its defaults (authors' code:
#: CoTTA's confidence threshold is 0.92 for CIFAR-10-C, 0.72 for
#: CIFAR-100-C).
METHOD_OPTIONS = {
    ('cifar10-c', 'cotta'): dict(ap=0.92),
    ('cifar100-c', 'cotta'): dict(ap=0.72),
}


def batch_scaled_lr(lr: float, batch_size: int, vit: bool) -> float:
    """``lr`` (batch 64) at ``batch_size`` by SAR's and DeYO's ``main.py``:
    ``B / 64`` for the ViT; for the ResNets ``2B / 64`` below 32, else
    ``lr`` unchanged."""
    if not vit and batch_size >= 32:
        return lr
    return lr / 64 * batch_size * (1 if vit else 2)


def optimizer_for(benchmark: str, scenario: str, model: str,
                  method: str = '') -> dict:
    """The baselines' reference optimizer for a setting: ImageNet-C's of
    SAR/DeYO's ``main.py``, CIFAR-C's of CoTTA's configs."""
    if method in ECOTTA_ROWS:
        return dict(type='SGD', lr=5e-3, momentum=0.9)
    if benchmark != 'imagenet-c':
        return dict(type='Adam', lr=1e-3, betas=(0.9, 0.999))
    vit = model == 'vit-b16'
    lr = batch_scaled_lr(0.001 if vit else 0.00025, SCENARIO_BATCH[scenario],
                         vit)
    return dict(type='SGD', lr=lr, momentum=0.9)
