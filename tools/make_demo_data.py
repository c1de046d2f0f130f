"""Write the offline demo benchmark (Cityscapes-style source + ACDC-layout
target with fog/night/rain/snow)::

    python tools/make_demo_data.py work_dirs/demo/data [--size 256 128]
        [--train 240] [--val 16] [--per-condition 10] [--seed 0] [--force]

Re-running with the same parameters is a no-op (``manifest.json``).
"""
import argparse
import os.path as osp
import sys
import time

REPO = osp.dirname(osp.dirname(osp.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

from demo_data import make_demo_benchmark


def main():
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('root', help='output folder')
    parser.add_argument('--size', type=int, nargs=2, default=(256, 128),
                        metavar=('W', 'H'))
    parser.add_argument('--train', type=int, default=240)
    parser.add_argument('--val', type=int, default=16)
    parser.add_argument('--per-condition', type=int, default=10)
    parser.add_argument('--seed', type=int, default=0)
    parser.add_argument('--force', action='store_true',
                        help='regenerate even if the manifest matches')
    args = parser.parse_args()
    start = time.time()
    paths = make_demo_benchmark(args.root, tuple(args.size), args.train,
                                args.val, args.per_condition, args.seed,
                                args.force)
    print(f'demo data ready in {time.time() - start:.1f} s: {paths}')


if __name__ == '__main__':
    main()
