"""The images of a config's test stream, in stream order, as a list file
that ``tools/adapt.py`` reads (e.g. to adapt on the benchmark's frames
without their labels)::

    python tools/stream_list.py CONFIG --out FILE [--cfg-options k=v ...]
"""
import argparse
import os
import os.path as osp
import sys

REPO = osp.dirname(osp.dirname(osp.abspath(__file__)))
if REPO not in sys.path:  # the package, not installed in a checkout
    sys.path.insert(0, REPO)


def main(argv=None) -> int:
    from mmengine.config import Config, DictAction
    parser = argparse.ArgumentParser(
        description="write a config's test stream as a list of images")
    parser.add_argument('config')
    parser.add_argument('--out', required=True, help='the list file')
    parser.add_argument('--cfg-options', nargs='+', action=DictAction,
                        help='override config settings, as tools/test.py')
    args = parser.parse_args(argv)
    if not osp.isfile(args.config):
        raise SystemExit(f'error: config file not found: {args.config}')
    cfg = Config.fromfile(args.config)
    if args.cfg_options:
        cfg.merge_from_dict(args.cfg_options)
    from mmengine.registry import init_default_scope
    from mmseg.registry import DATASETS

    import mmseg_stag  # noqa: F401  (registers the datasets)
    init_default_scope(cfg.get('default_scope', 'mmseg'))
    try:
        dataset = DATASETS.build(cfg.test_dataloader.dataset)
    except (OSError, ValueError) as err:
        raise SystemExit(f'error: {err}') from None
    paths = [dataset.get_data_info(i)['img_path']
             for i in range(len(dataset))]
    os.makedirs(osp.dirname(osp.abspath(args.out)), exist_ok=True)
    with open(args.out, 'w', encoding='utf-8') as f:
        f.write(f'# the test stream of {args.config}, in order\n')
        f.write('\n'.join(osp.abspath(p) for p in paths) + '\n')
    print(f'[stream_list] {len(paths)} images -> {args.out}')
    return 0


if __name__ == '__main__':
    sys.exit(main())
