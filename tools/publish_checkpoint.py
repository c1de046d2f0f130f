"""Rewrite a checkpoint as ``state_dict`` + plain ``meta`` so that it loads
with ``torch.load(weights_only=True)``::

    python tools/publish_checkpoint.py SRC DST [--trust-pickle]

MMEngine's Runner stores Python objects (``HistoryBuffer``, numpy scalars) in
its checkpoints, which the safe loader refuses; ``--trust-pickle`` is needed
to read such a file and must only be used for files you produced or trust.
"""
import argparse

from mmseg_stag.checkpoint import published_checkpoint
from mmseg_stag.engine.report import write_torch


def main():
    parser = argparse.ArgumentParser(
        description='Publish a checkpoint as state_dict + plain meta')
    parser.add_argument('src', help='checkpoint to read')
    parser.add_argument('dst', help='checkpoint to write')
    parser.add_argument('--trust-pickle', action='store_true',
                        help='allow unsafe unpickling of SRC (trusted files '
                        'only, e.g. one your own training run saved)')
    args = parser.parse_args()
    checkpoint = published_checkpoint(args.src,
                                      allow_unsafe_pickle=args.trust_pickle)
    write_torch(args.dst, checkpoint)  # atomic, its folder made
    print(f'published {len(checkpoint["state_dict"])} tensors: {args.src} '
          f'-> {args.dst}')


if __name__ == '__main__':
    main()
