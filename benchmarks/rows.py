"""What the analysis commands share (``tools/analysis/``): the
``CHECKPOINT --row NAME CONFIG`` arguments, a config restricted to one
stage of its stream, a run's mean score, the figure and number files."""
import argparse
import os.path as osp

from mmseg_stag.engine.report import write_files


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


def check_files(p: argparse.ArgumentParser, files) -> None:
    """A parser error for the first ``(what, path)`` that is no file."""
    for what, path in files:
        if not osp.isfile(path):
            p.error(f'{what} file not found: {path}')


def parse_rows(p: argparse.ArgumentParser, argv=None) -> argparse.Namespace:
    """Parse :func:`row_parser`'s arguments; the files must exist."""
    args = p.parse_args(argv)
    check_files(p, [('checkpoint', args.checkpoint)] + [
        (f'--row {name}: config', config) for name, config in args.row])
    return args


def slug(name: str) -> str:
    """A folder name for a row."""
    return ''.join(c if c.isalnum() else '_' for c in name).strip('_') \
        or 'row'


def stage_config(config: str, cfg_options: dict, condition=None,
                 images=None, whole_stream=False):
    """``config`` with ``cfg_options`` on its first stage (or
    ``condition``'s) alone, limited to ``images`` images."""
    from mmengine.config import Config

    from mmseg_stag.paper.protocol import (first_stage_cfg_options,
                                           images_per_stage_cfg_options)
    cfg = Config.fromfile(config)
    cfg.merge_from_dict(cfg_options)
    if not whole_stream:
        cfg.merge_from_dict(first_stage_cfg_options(cfg, condition))
    if images:
        cfg.merge_from_dict(images_per_stage_cfg_options(cfg, images))
    return cfg


def require_stag(cfg, config: str) -> dict:
    """``cfg``'s ``test_cfg.method.stag``; a ValueError if it has none."""
    stag = cfg.get('test_cfg', {}).get('method', {}).get('stag')
    if not stag:
        raise ValueError(f'{config} has no test_cfg.method.stag: give a '
                         '-stag config')
    return stag


def run_stage(config: str, args, work_dir: str, hook) -> None:
    """Run a row's stage (``args``: :func:`row_parser`'s and ``images``)
    through tools/test.py's run with ``hook``, saving no state."""
    from mmseg_stag.engine.runs import prepare_config, run_test
    cfg = stage_config(config, args.cfg_options, args.condition, args.images)
    cfg.test_cfg.save_state = False
    run_test(prepare_config(cfg, work_dir), args.checkpoint, hooks=[hook])


def mean_score(results: dict):
    """A run's score (``report.read_results``): the mean over its stages
    and the score's name (``acc``/``mIoU``)."""
    scores = [s['score'] for s in results['stages']]
    return sum(scores) / len(scores), results['score_name']


def pyplot():
    """``matplotlib.pyplot`` drawing to files (the Agg backend)."""
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    return plt


def save_figure(fig, path: str, crop: bool = False) -> None:
    """Save ``fig`` at 130 dpi, laid out tightly (or cropped), and close."""
    if not crop:
        fig.tight_layout()
    fig.savefig(path, dpi=130, bbox_inches='tight' if crop else None)
    pyplot().close(fig)


def write_numbers(out_dir: str, name: str, data: dict, header,
                  rows) -> str:
    """Write ``data`` as ``out_dir/name.json`` and ``header`` + ``rows``
    as ``name.csv``; return ``out_dir/name``."""
    write_files(out_dir, name, data, [list(header)] + [list(r) for r in rows])
    return osp.join(out_dir, name)
