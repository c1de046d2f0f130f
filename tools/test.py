"""Test (and adapt online) a segmentor or a classifier: MMSeg's test entry
point for STAG, for both tasks (a classification config needs neither MMSeg
nor MMCV). Same usage and flags as MMSegmentation's ``tools/test.py``::

    python tools/test.py CONFIG CHECKPOINT [--work-dir DIR] [--out DIR]
        [--show] [--show-dir DIR] [--cfg-options k=v ...] [--launcher none]
        [--save-adapted FILE] [--resume] [--seed N] [--deterministic]

The checkpoint loads with the safe, strict loader (``--trust-pickle`` for
trusted legacy pickles); the method comes from the config's ``test_cfg``.
Resuming and reproducibility: docs/running.md; the loop:
docs/segmentation.md.
"""
import argparse
import os
import os.path as osp
import sys
import time

from mmengine.config import Config, DictAction

REPO = osp.dirname(osp.dirname(osp.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)


def realtime_cost(text: str):
    """``--realtime``'s value: a number > 0, or ``measure`` (adapt.py and
    reproduce.py read it alike: tests/tools/test_realtime_argument.py)."""
    if text == 'measure':
        return text
    try:
        cost = float(text)
    except ValueError:
        cost = float('nan')
    if not cost > 0 or cost == float('inf'):
        raise argparse.ArgumentTypeError(
            f'{text!r}: a step\'s cost in forwards, a number > 0, or '
            'measure')
    return cost


def parse_args():
    parser = argparse.ArgumentParser(
        description='MMSeg test (and online test-time adaptation)')
    add = parser.add_argument
    add('config', help='test config file path')
    add('checkpoint', help='checkpoint file')
    add('--work-dir', help='directory for logs and results (default: '
        './work_dirs/<config name>)')
    add('--out', type=str, help='directory for the results (continual_'
        'results.json/.csv, the per-stage plot, the partial JSONL) instead '
        'of the work dir; the log and run state stay in the work dir')
    add('--show', action='store_true', help='show prediction results')
    add('--show-dir', help='directory where painted predictions are saved '
        '(under DIR/vis_data/vis_image/, one every '
        'default_hooks.visualization.interval images; a later round '
        'overwrites the same file name, so the last round remains)')
    add('--wait-time', type=float, default=2,
        help='the interval of show (s)')
    add('--trust-pickle', action='store_true', help='allow unsafe '
        'unpickling of a trusted legacy checkpoint (torch.load '
        'weights_only=False); off by default')
    add('--save-adapted', metavar='FILE', help='after the stream, save the '
        'adapted model to FILE (a plain {"state_dict", "meta"} checkpoint, '
        'loadable with weights_only=True, by this script with the method\'s '
        'or the Source config, and by MMSeg\'s MMSegInferencer with the '
        'inference config written beside it, <FILE stem>.py)')
    add('--resume', action='store_true', help='continue the online run in '
        '--work-dir from its last finished stage '
        '(online_adaptation_state.pth); refused if that run had another '
        'config or checkpoint')
    add('--seed', type=int,
        help='random seed (default: the config\'s randomness.seed)')
    add('--deterministic', action='store_true', help='PyTorch\'s '
        'deterministic algorithms (and cuDNN\'s, and a fixed cuBLAS '
        'workspace): repeatable runs on a GPU; the few operations without '
        'a deterministic CUDA kernel are warned about and named in the log '
        '(docs/running.md, Reproducibility)')
    add('--realtime', metavar='COST', type=realtime_cost,
        help='the realistic online protocol (docs/realtime.md): a step '
        'costs COST forwards and the batches that arrive during it are '
        'predicted without an update; measure: the cost timed on the '
        "first batch (sets test_cfg.realtime=dict(cost=...))")
    add('--cfg-options', nargs='+', action=DictAction, help='override '
        'settings of the config, key=value pairs, e.g. '
        'test_dataloader.dataset.data_root=data/acdc '
        'test_dataloader.dataset.rounds=1')
    add('--launcher', choices=['none', 'pytorch', 'slurm', 'mpi'],
        default='none', help='job launcher')
    add('--local_rank', '--local-rank', type=int, default=0)
    args = parser.parse_args()
    os.environ.setdefault('LOCAL_RANK', str(args.local_rank))
    return args


def trigger_visualization_hook(cfg, args):
    if 'visualization' not in cfg.default_hooks:
        raise RuntimeError(
            'VisualizationHook must be included in default_hooks, e.g. '
            "visualization=dict(type='SegVisualizationHook')")
    hook = cfg.default_hooks['visualization']
    hook['draw'] = True
    if args.show:
        hook.update(show=True, wait_time=args.wait_time)
    if args.show_dir:
        cfg.visualizer['save_dir'] = args.show_dir
    return cfg


def main():
    args = parse_args()
    if not osp.isfile(args.config):
        raise FileNotFoundError(f'config file not found: {args.config}')
    if not osp.isfile(args.checkpoint):
        raise FileNotFoundError(f'checkpoint file not found: '
                                f'{args.checkpoint}')
    from mmseg_stag.engine.launch_guard import LaunchError
    from mmseg_stag.engine.runs import prepare_config, run_test

    cfg = Config.fromfile(args.config)
    if args.cfg_options is not None:
        cfg.merge_from_dict(args.cfg_options)
    try:
        cfg = prepare_config(cfg, args.work_dir, args.config, args.launcher,
                             args.seed, args.deterministic, args.resume,
                             realtime=args.realtime)
    except LaunchError as err:
        if err.every_rank_reports:
            # every rank reports before the launcher stops the others
            print(f'error: {err}', file=sys.stderr, flush=True)
            time.sleep(2)
            raise SystemExit(1) from None
        raise SystemExit(f'error: {err}') from None
    except ValueError as err:
        raise SystemExit(f'error: {err}') from None
    if args.show or args.show_dir:
        cfg = trigger_visualization_hook(cfg, args)
    if args.out is not None:
        # every metric of a list (each writes its own file names there)
        evaluators = cfg.test_evaluator if isinstance(
            cfg.test_evaluator, (list, tuple)) else [cfg.test_evaluator]
        # absolute: the config dumped in the work dir names it, and
        # tools/collect_results.py, run from anywhere, finds the results
        out = osp.abspath(args.out)
        for evaluator in evaluators:
            evaluator['output_dir'] = out
            evaluator['keep_results'] = True
    run_test(cfg, args.checkpoint, args.trust_pickle,
             hooks=save_adapted(args))


def save_adapted(args) -> list:
    """``--save-adapted FILE``: the hook that saves the adapted model after
    the stream (the student, for CoTTA and Hybrid-TTA) as a checkpoint the
    strict loader and MMSeg's inferencer read, with the inference config
    ``<FILE stem>.py`` beside it (docs/adapt.md); none without it."""
    if not args.save_adapted:
        return []
    from mmseg_stag.engine.runs import SaveAdapted
    if args.save_adapted.endswith('.py'):
        raise SystemExit(f'error: --save-adapted {args.save_adapted}: name '
                         'the checkpoint .pth; its inference config is '
                         '<name>.py beside it')
    return [SaveAdapted(args.save_adapted, dict(
        config=args.config, checkpoint=args.checkpoint))]


if __name__ == '__main__':
    main()
