"""What the analysis commands share (``tools/analysis/``): the
``CHECKPOINT --row NAME CONFIG`` arguments, a config restricted to one
stage of its stream, a run's mean score."""
import argparse
import os.path as osp


def row_parser(description: str,
               work_dir: str) -> argparse.ArgumentParser:
    """``CHECKPOINT --row NAME CONFIG ... [--condition C] [--work-dir W]
    [--cfg-options ...]``."""
    from mmengine.config import DictAction
    p = argparse.ArgumentParser(description=description)
    p.add_argument('checkpoint')
    p.add_argument('--row', nargs=2, action='append', required=True,
                   metavar=('NAME', 'CONFIG'))
    p.add_argument('--condition', default=None, help='the stage to run: '
                   'a corruption / ACDC condition (default: the first)')
    p.add_argument('--work-dir', default=work_dir)
    p.add_argument('--cfg-options', nargs='+', action=DictAction,
                   default={}, help='settings of every run')
    return p


def check_rows(p: argparse.ArgumentParser, args) -> None:
    """The checkpoint and every row's config exist (a parser error)."""
    if not osp.isfile(args.checkpoint):
        p.error(f'checkpoint file not found: {args.checkpoint}')
    for name, config in args.row:
        if not osp.isfile(config):
            p.error(f'--row {name}: config file not found: {config}')


def slug(name: str) -> str:
    """A folder name for a row."""
    return ''.join(c if c.isalnum() else '_' for c in name).strip('_') \
        or 'row'


def stage_config(config: str, cfg_options: dict, condition=None,
                 images=None, whole_stream=False):
    """``config`` with ``cfg_options`` on its first stage (or
    ``condition``'s) alone, limited to ``images`` images."""
    from mmengine.config import Config

    from mmseg_stag.paper_protocol import (first_images_options,
                                           first_stage_options)
    cfg = Config.fromfile(config)
    cfg.merge_from_dict(cfg_options)
    if not whole_stream:
        cfg.merge_from_dict(first_stage_options(cfg, condition))
    if images:
        cfg.merge_from_dict(first_images_options(cfg, images))
    return cfg


def mean_score(results: dict):
    """A run's score (``report.read_results``): the mean over its stages
    and the score's name (``acc``/``mIoU``)."""
    scores = [s['score'] for s in results['stages']]
    return sum(scores) / len(scores), results['score_name']
