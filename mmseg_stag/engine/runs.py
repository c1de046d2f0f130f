"""One online run from a config, as ``tools/test.py`` runs it, in-process."""
import json
import logging
import os
import os.path as osp
import sys
import time
import uuid
from typing import Optional

from mmengine.config import Config
from mmengine.logging import print_log
from mmengine.model import is_model_wrapper
from mmengine.runner import Runner

from .online_loop import DISTRIBUTED_ERROR, STATE_FILE


def is_online(cfg: Config) -> bool:
    return cfg.get('test_cfg', {}).get('type') == 'OnlineAdaptationLoop'


def prepare_config(cfg: Config, work_dir: Optional[str] = None,
                   config_path: Optional[str] = None,
                   launcher: str = 'none', seed: Optional[int] = None,
                   deterministic: bool = False,
                   resume: bool = False) -> Config:
    """Set a run's work dir and randomness; check its launcher and resume.

    Raises:
        SystemExit: If the run is distributed or ``resume`` cannot apply.
    """
    cfg.launcher = launcher
    online = is_online(cfg)
    world_size = int(os.environ.get('WORLD_SIZE', '1'))
    if online and (launcher != 'none' or world_size > 1):
        # before any process group or worker starts (the loop refuses too)
        n = world_size if world_size > 1 else 'several'
        message = 'error: ' + DISTRIBUTED_ERROR.format(n=n)
        if world_size > 1:
            # every rank reports before the launcher stops the others
            print(message, file=sys.stderr, flush=True)
            time.sleep(2)
            raise SystemExit(1)
        raise SystemExit(message)
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
    if resume:
        if not online:
            raise SystemExit('error: --resume continues an online-adaptation'
                             ' run (test_cfg.type=OnlineAdaptationLoop); this '
                             "config runs MMEngine's plain test loop")
        state = osp.join(cfg.work_dir, STATE_FILE)
        if not osp.isfile(state):
            raise SystemExit(f'error: --resume: no previous run in '
                             f'{cfg.work_dir} ({state} does not exist); run '
                             'without --resume to start it, or give its '
                             '--work-dir')
        cfg.test_cfg.resume = True
    # loaded by run_test through the safe, strict loader, not MMEngine's
    cfg.load_from = None
    return cfg


def run_test(cfg: Config, checkpoint: str,
             allow_unsafe_pickle: bool = False, hooks=()) -> tuple:
    """Build the Runner, load the source weights and run the test loop.

    Args:
        cfg (Config): The prepared config.
        checkpoint (str): The source checkpoint.
        allow_unsafe_pickle (bool): Whether to unpickle beyond
            ``weights_only``. Default: False.
        hooks (Sequence[Hook]): Hook objects to register. Default: ().

    Returns:
        tuple: The evaluator's metrics and the adapted model.

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
    from mmseg_stag.checkpoint import load_model_checkpoint
    model = runner.model.module if is_model_wrapper(runner.model) \
        else runner.model
    try:
        load_model_checkpoint(model, checkpoint, allow_unsafe_pickle,
                              cfg.get('test_cfg', {}).get('classifier'))
        print_log(f'Loaded checkpoint {checkpoint}', logger='current')
        metrics = runner.test()
    finally:
        for handler in list(runner.logger.handlers):
            if isinstance(handler, logging.FileHandler):
                handler.close()
                runner.logger.removeHandler(handler)
    return metrics, model


def run_config(config, checkpoint: str, work_dir: Optional[str] = None,
                cfg_options: Optional[dict] = None, **kwargs) -> dict:
    """Run ``tools/test.py CONFIG CHECKPOINT`` in this process.

    Returns:
        dict: The evaluator's metrics.
    """
    cfg = config.copy() if isinstance(config, Config) \
        else Config.fromfile(config)
    if cfg_options:
        cfg.merge_from_dict(cfg_options)
    cfg = prepare_config(cfg, work_dir,
                         None if isinstance(config, Config) else config,
                         **kwargs)
    return run_test(cfg, checkpoint)[0]


def run_cached(cfg: Config, checkpoint: str, work_dir: str,
               needs=('continual_results.json', ),
               config_name: str = 'run_config.py') -> dict:
    """Run ``cfg`` in ``work_dir`` unless a finished run of it is there.

    Returns:
        dict: The run's ``continual_results.json``.
    """
    text = cfg.pretty_text
    saved = osp.join(work_dir, config_name)
    done = all(osp.isfile(osp.join(work_dir, f)) for f in needs) and \
        osp.isfile(saved) and open(saved).read() == text
    if not done:
        os.makedirs(work_dir, exist_ok=True)
        run_test(prepare_config(cfg.copy(), work_dir), checkpoint)
        with open(saved, 'w') as f:
            f.write(text)
    with open(osp.join(work_dir, 'continual_results.json')) as f:
        return json.load(f)
