"""Convert NVlabs' SegFormer checkpoint for the ``*nvlabs*`` configs.

    python tools/convert_nvlabs_segformer.py \
        segformer.b5.1024x1024.city.160k.pth \
        checkpoints/segformer_b5_nvlabs_city_mmseg.pth

The source is read with ``torch.load(weights_only=True)``; a legacy pickle is
refused unless ``--trust-pickle`` is given (only for a file you trust).
"""
import argparse
import os
import os.path as osp

from mmseg_stag.models.nvlabs_convert import convert_nvlabs_checkpoint


def main():
    parser = argparse.ArgumentParser(
        description='Convert an NVlabs SegFormer checkpoint (MiT backbone + '
        'SegFormer head) to MMSeg 1.x keys for NVSegformerHead configs')
    parser.add_argument('src', help='NVlabs checkpoint (.pth)')
    parser.add_argument('dst', help='output checkpoint (.pth)')
    parser.add_argument(
        '--trust-pickle',
        action='store_true',
        help='allow unsafe unpickling of a trusted legacy checkpoint')
    args = parser.parse_args()
    if osp.dirname(args.dst):
        os.makedirs(osp.dirname(args.dst), exist_ok=True)
    count = convert_nvlabs_checkpoint(args.src, args.dst,
                                      allow_unsafe_pickle=args.trust_pickle)
    print(f'converted {count} tensors: {args.src} -> {args.dst}')


if __name__ == '__main__':
    main()
