"""Online adaptation (± STAG) on a corrupted classification benchmark.

    python tools/test_cls.py CONFIG [--work-dir DIR] [--data-root DIR]
        [--checkpoint FILE] [--trust-pickle] [--resume]
        [--cfg-options key=value ...]

CONFIG is a file under ``configs/cls/`` (scenario x model x baseline; the
``+STAG`` row uses the paper's beta0/gamma from Table appendix_hp). The run
prints the paper's table (rows: the baseline and +STAG, columns: the
corruptions, their average and STAG's gain) and writes into the work dir
(default ``work_dirs/cls/<config name>``):

* ``progress.jsonl``: one record per finished corruption, appended as it
  ends, and ``states/<row key>.pth``: each row's run state after its last
  finished stage (``--resume`` continues from them);
* ``results.json`` / ``results.csv`` / ``results.txt``: the table.

Example (CIFAR-10-C, RobustBench ``Standard.pt``)::

    python tools/test_cls.py \\
        configs/cls/cifar-c/cifar10-c_continual_wrn-28-10_tent.py \\
        --data-root data/CIFAR-10-C --checkpoint checkpoints/Standard.pt
"""
import argparse
import os.path as osp
import sys

REPO = osp.dirname(osp.dirname(osp.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description='Online adaptation (+/- STAG) on a corrupted '
        'classification benchmark (configs/cls/)')
    parser.add_argument('config', help='config file under configs/cls/')
    parser.add_argument('--work-dir', help='output folder (default: '
                        'work_dirs/cls/<config name>)')
    parser.add_argument('--data-root', help='overrides data.data_root')
    parser.add_argument('--checkpoint', help='weight file of the source '
                        'model (overrides model.checkpoint)')
    parser.add_argument('--trust-pickle', action='store_true',
                        help='load a weight file that needs unpickling '
                        'arbitrary objects (only for files you trust)')
    parser.add_argument('--resume', action='store_true',
                        help='continue a killed run: the stages recorded in '
                        'WORK_DIR/progress.jsonl are kept and each row goes '
                        'on from its run state in WORK_DIR/states/')
    parser.add_argument('--cfg-options', nargs='+', default=[],
                        metavar='KEY=VALUE',
                        help='override config keys, e.g. '
                        'data.n_examples=1000 rows=[base]')
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    from mmengine.config import Config, DictAction

    import mmseg_stag  # noqa: F401  (registers the methods and STAGLoss)
    from mmseg_stag.classification import run_experiment

    cfg = Config.fromfile(args.config)
    if args.cfg_options:
        action = DictAction(option_strings=[], dest='cfg_options')
        namespace = argparse.Namespace()
        action(None, namespace, args.cfg_options)
        cfg.merge_from_dict(namespace.cfg_options)
    work_dir = args.work_dir or cfg.get('work_dir') or osp.join(
        'work_dirs', 'cls', osp.splitext(osp.basename(args.config))[0])
    try:
        run_experiment(cfg, work_dir, checkpoint=args.checkpoint,
                       data_root=args.data_root,
                       allow_unsafe_pickle=args.trust_pickle,
                       resume=args.resume)
    except (FileNotFoundError, ImportError) as err:
        raise SystemExit(f'error: {err}')


if __name__ == '__main__':
    main()
