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


def numbers(record: dict) -> dict:
    """A run's record without its ``provenance`` (the code, the machine,
    the wall time, whether it was resumed): what two runs of one setting
    must agree on, to the bit."""
    assert 'provenance' in record, sorted(record)  # every run writes it
    return {k: v for k, v in record.items() if k != 'provenance'}


def killable_config(base: str, opts: dict, folder, kill=True,
                    name: str = 'killable.py') -> str:
    """``base`` with ``opts`` (dotted keys) and the test-only kill hook, as
    one config file (the killed and the resumed run share it)."""
    nested: dict = {}
    for key, value in opts.items():
        *parents, leaf = key.split('.')
        node = nested
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    text = f'_base_ = [{base!r}]\n' + ''.join(
        f'{key} = {value!r}\n' for key, value in nested.items())
    if kill:
        text += ("custom_imports = dict(imports=['mmseg_stag', 'kill_hook'],"
                 ' allow_failed_imports=False)\n'
                 "custom_hooks = [dict(type='KillAtStage')]\n")
    path = osp.join(str(folder), name)
    with open(path, 'w') as f:
        f.write(text)
    return path
