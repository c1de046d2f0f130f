"""``tools/test.py CONFIG CHECKPOINT`` in the tests' process."""
import json
import os.path as osp

from mmengine.config import Config

from mmseg_stag.engine.runs import prepare_config, run_test


def run_config(config: str, checkpoint: str, work_dir, cfg_options=None,
               **kwargs) -> dict:
    """Run a config file with ``--cfg-options`` as ``tools/test.py`` does.

    Args:
        config (str): The config file.
        checkpoint (str): The source checkpoint.
        work_dir: The run's work dir.
        cfg_options (dict, optional): Merged into the config.
        **kwargs: See :func:`mmseg_stag.engine.runs.prepare_config`.

    Returns:
        dict: The run's ``continual_results.json``.
    """
    cfg = Config.fromfile(config)
    cfg.merge_from_dict(cfg_options or {})
    run_test(prepare_config(cfg, str(work_dir), config, **kwargs), checkpoint)
    with open(osp.join(str(work_dir), 'continual_results.json')) as f:
        return json.load(f)
