"""One online run from a config, as ``tools/test.py`` runs it, in-process."""
import logging
import os
import os.path as osp
import uuid
from typing import Optional

from mmengine.config import Config
from mmengine.hooks import Hook
from mmengine.logging import print_log
from mmengine.registry import MODELS, DefaultScope
from mmengine.runner import Runner, set_random_seed

from mmseg_stag.checkpoint import adapted_checkpoint, load_model_checkpoint
from .launch_guard import check_single_process
from .online_loop import runner_model
from .online_task import head_layer_of
from .report import read_results
from .run_state import (RESUME_IGNORES, STATE_FILE, identity_differences,
                        load_run_state, rng_state, run_identity, set_rng_state)


def prepare_config(cfg: Config, work_dir: Optional[str] = None,
                   config_path: Optional[str] = None,
                   launcher: str = 'none', seed: Optional[int] = None,
                   deterministic: bool = False,
                   resume: bool = False, realtime=None) -> Config:
    """Set a run's work dir and randomness; check its launch
    (``LaunchError``) and resume (``ValueError``); ``realtime``: a cost
    (or ``'measure'``) for ``test_cfg.realtime`` (``--realtime``)."""
    cfg.launcher = launcher
    online = cfg.get('test_cfg', {}).get('type') == 'OnlineAdaptationLoop'
    if online:
        # before any process group or worker starts (the loop checks too)
        check_single_process(int(os.environ.get('WORLD_SIZE', '1')),
                             launcher=launcher)
    if work_dir is not None:
        cfg.work_dir = work_dir
    elif cfg.get('work_dir', None) is None:
        name = osp.splitext(osp.basename(config_path or 'run'))[0]
        cfg.work_dir = osp.join('./work_dirs', name)
    randomness = dict(cfg.get('randomness', None) or {})
    if seed is not None:
        randomness['seed'] = seed
    if deterministic:
        randomness['deterministic'] = True
        # cuBLAS needs a fixed workspace for repeatable GEMMs
        os.environ.setdefault('CUBLAS_WORKSPACE_CONFIG', ':4096:8')
    cfg.randomness = randomness
    if realtime is not None:
        if not online:
            raise ValueError('--realtime is a protocol of online '
                             'adaptation (test_cfg.type='
                             "OnlineAdaptationLoop); this config runs "
                             "MMEngine's plain test loop")
        cfg.test_cfg.realtime = dict(cost=realtime)
    if resume:
        if not online:
            raise ValueError('--resume continues an online-adaptation run '
                             '(test_cfg.type=OnlineAdaptationLoop); this '
                             "config runs MMEngine's plain test loop")
        state = osp.join(cfg.work_dir, STATE_FILE)
        if not osp.isfile(state):
            raise ValueError(f'--resume: no previous run in '
                             f'{cfg.work_dir} ({state} does not exist); run '
                             'without --resume to start it, or give its '
                             '--work-dir')
        cfg.test_cfg.resume = True
    # loaded by run_test through the safe, strict loader, not MMEngine's
    cfg.load_from = None
    return cfg


def run_test(cfg: Config, checkpoint: str,
             allow_unsafe_pickle: bool = False, hooks=()) -> tuple:
    """Build the Runner of the prepared ``cfg``, register ``hooks``, load
    the source weights and run the test loop; return the evaluator's
    metrics and the adapted model.

    Raises:
        FileNotFoundError: If ``checkpoint`` does not exist.
    """
    if not osp.isfile(checkpoint):
        raise FileNotFoundError(f'checkpoint file not found: {checkpoint}')
    # unique per run: runs in one process keep their own logger and hub
    name = osp.basename(osp.normpath(cfg.work_dir))
    cfg.setdefault('experiment_name', f'{name}_{uuid.uuid4().hex[:8]}')
    runner = Runner.from_cfg(cfg)
    for hook in hooks:
        runner.register_hook(hook)
    model = runner_model(runner)
    try:
        load_model_checkpoint(model, checkpoint, allow_unsafe_pickle,
                              head_layer_of(cfg))
        print_log(f'Loaded checkpoint {checkpoint}', logger='current')
        metrics = runner.test()
    finally:
        for handler in list(runner.logger.handlers):
            if isinstance(handler, logging.FileHandler):
                handler.close()
                runner.logger.removeHandler(handler)
    return metrics, model


class SaveAdapted(Hook):
    """After the test loop, the adapted model saved to ``path``
    (``tools/test.py --save-adapted``): the online loop's
    :meth:`~mmseg_stag.engine.OnlineAdaptationLoop.save_adapted` (the
    checkpoint and a segmentor's inference config beside it), else the
    model's weights."""

    priority = 'VERY_LOW'

    def __init__(self, path: str, meta: Optional[dict] = None):
        self.path, self.meta = path, dict(meta or {})
        #: the inference config written beside the checkpoint, if any
        self.config_path: Optional[str] = None

    def after_test(self, runner) -> None:
        loop = runner.test_loop
        if hasattr(loop, 'save_adapted'):
            self.config_path = loop.save_adapted(self.path, self.meta)
        else:  # MMEngine's plain loop adapts nothing
            from .report import write_torch
            write_torch(self.path, adapted_checkpoint(
                runner_model(runner), None, self.meta))
        print_log(f'adapted model saved to {self.path}' + (
            f' (MMSeg inference config: {self.config_path})'
            if self.config_path else ''), logger='current')


def starting_identity(cfg: Config, checkpoint: str,
                      allow_unsafe_pickle: bool = False) -> dict:
    """The identity the online loop gives a run of ``cfg``, without the
    run: the model built as MMEngine's ``Runner`` builds it (default scope,
    ``randomness.seed``), the checkpoint loaded by the strict loader."""
    model_cfg = dict(cfg.model)
    if cfg.get('data_preprocessor') is not None:
        model_cfg.setdefault('data_preprocessor', cfg.data_preprocessor)
    outer = rng_state()
    try:
        set_random_seed((cfg.get('randomness') or {}).get('seed'))
        with DefaultScope.overwrite_default_scope(cfg.get('default_scope')):
            model = MODELS.build(model_cfg)
    finally:
        set_rng_state(outer)
    load_model_checkpoint(model, checkpoint, allow_unsafe_pickle,
                          head_layer_of(cfg))
    return run_identity(cfg.to_dict(), model)


def finished_identity(work_dir: str, needs=()) -> Optional[dict]:
    """The identity the online loop saved with a finished run in
    ``work_dir``; None if none finished there, ``needs`` are missing or
    this version cannot read its results (``report.read_results``)."""
    if not all(osp.isfile(osp.join(work_dir, f))
               for f in (*needs, STATE_FILE)):
        return None
    try:
        state = load_run_state(osp.join(work_dir, STATE_FILE), mmap=True)
    except RuntimeError:
        return None
    if state.get('batches_done') != state.get('num_batches'):
        return None
    try:
        read_results(work_dir)
    except (FileNotFoundError, ValueError):
        return None
    return state.get('identity')


def run_cached(cfg: Config, checkpoint: str, work_dir: str,
               needs=('continual_results.json', ),
               config_name: str = 'run_config.py') -> dict:
    """Run ``cfg`` in ``work_dir`` unless a finished run of it is there
    (the identity its run state saved is this run's, as ``--resume``
    checks it, and its results are of this schema); write the config to
    ``config_name`` and return the results (``report.read_results``)."""
    prepared = prepare_config(cfg.copy(), work_dir)
    saved = finished_identity(work_dir, needs)
    if saved is not None and not identity_differences(
            saved, starting_identity(prepared, checkpoint), RESUME_IGNORES):
        print_log(f'{work_dir}: the finished run of this config and '
                  'checkpoint is reused', logger='current')
    else:
        os.makedirs(work_dir, exist_ok=True)
        run_test(prepared, checkpoint)
        with open(osp.join(work_dir, config_name), 'w') as f:
            f.write(cfg.pretty_text)
    return read_results(work_dir)
