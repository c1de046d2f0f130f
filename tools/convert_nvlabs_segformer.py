"""Convert an NVlabs SegFormer checkpoint for the ``*nvlabs*`` configs.

    python tools/convert_nvlabs_segformer.py \
        segformer.b5.1024x1024.city.160k.pth \
        checkpoints/segformer_b5_nvlabs_city.pth

Reads the source with ``torch.load(weights_only=True)`` (``--trust-pickle``
only for a legacy pickle you trust) and writes ``state_dict`` + plain
``meta`` for MMSeg's MiT with NVlabs' LayerNorm eps values
(``NVMixVisionTransformer``) and ``NVSegformerHead``; the key mapping is
``mmseg_stag.segmentation.models.nvlabs_convert`` (documented there).
"""
import argparse
import os.path as osp
import sys

REPO = osp.dirname(osp.dirname(osp.abspath(__file__)))
if REPO not in sys.path:  # the package, not installed in a checkout
    sys.path.insert(0, REPO)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description='Convert an NVlabs SegFormer checkpoint (MiT backbone + '
        'SegFormerHead) to MMSeg 1.x keys (NVMixVisionTransformer + '
        'NVSegformerHead)')
    parser.add_argument('src', help='NVlabs checkpoint (.pth)')
    parser.add_argument('dst', help='output checkpoint (.pth)')
    parser.add_argument(
        '--trust-pickle',
        action='store_true',
        help='allow unsafe unpickling (torch.load weights_only=False) of a '
        'trusted legacy checkpoint that the safe loader refuses')
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    try:
        from mmseg_stag.segmentation.models.nvlabs_convert import \
            convert_nvlabs_checkpoint
        count = convert_nvlabs_checkpoint(
            args.src, args.dst, allow_unsafe_pickle=args.trust_pickle)
    except (OSError, RuntimeError, ValueError) as err:  # one sentence:
        sys.exit(f'error: {err}')  # a file unreadable or unwritable
    print(f'converted {count} tensors: {args.src} -> {args.dst}')


if __name__ == '__main__':
    main()
