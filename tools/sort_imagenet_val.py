"""Sort ImageNet's flat validation folder into ``<wnid>/`` class folders.

    python tools/sort_imagenet_val.py data/imagenet/val \\
        --devkit data/imagenet/ILSVRC2012_devkit_t12
    python tools/sort_imagenet_val.py data/imagenet/val --labels val.txt

``ILSVRC2012_img_val.tar`` holds 50,000 files in one folder; the loaders
(``ImageFolder``, EATA's clean images) read ``<val>/<wnid>/*.JPEG``. The
class of each image comes from the devkit (``data/meta.mat`` and
``data/ILSVRC2012_validation_ground_truth.txt``; reading ``meta.mat``
needs scipy) or from a labels file whose lines start with an image name
(extension optional) and its wnid, separated by spaces, tabs or commas.
Everything is checked before a file moves; a second run finds the images
in place and moves nothing. See docs/data.md.
"""
import argparse
import os
import os.path as osp
import re
import shutil
import sys

WNID = re.compile(r'^n\d{8}$')
GROUND_TRUTH = 'ILSVRC2012_validation_ground_truth.txt'


def read_labels(path):
    """Return ``{image name: wnid}`` of a labels file."""
    labels = {}
    with open(path, encoding='utf-8') as f:
        for number, line in enumerate(f, 1):
            fields = re.split(r'[\s,]+', line.strip())
            if len(fields) >= 2 and WNID.match(fields[1]):
                labels[fields[0]] = fields[1]
            elif number > 1 and line.strip():  # line 1 may be a header
                raise ValueError(f'{path}:{number}: expected "<image> '
                                 f'<wnid>", got {line.strip()!r}')
    if not labels:
        raise ValueError(f'{path}: no "<image> <wnid>" line')
    return labels


def read_devkit(devkit):
    """Return ``{image name: wnid}`` from the ILSVRC2012 devkit."""
    data = osp.join(devkit, 'data')
    meta_path, truth_path = (osp.join(data, name)
                             for name in ('meta.mat', GROUND_TRUTH))
    for path in (meta_path, truth_path):
        if not osp.isfile(path):
            raise FileNotFoundError(f'devkit file not found: {path}')
    try:
        from scipy.io import loadmat
    except ImportError as err:
        raise RuntimeError('reading meta.mat needs scipy (pip install '
                           'scipy), or give --labels') from err
    synsets = loadmat(meta_path, squeeze_me=True)['synsets']
    # the 1,000 classes are the leaves; their IDs are 1..1000
    wnid_of = {int(i): str(w) for i, w, n in zip(
        synsets['ILSVRC2012_ID'], synsets['WNID'], synsets['num_children'])
        if int(n) == 0}
    with open(truth_path, encoding='utf-8') as f:
        ids = [int(line) for line in f if line.strip()]
    unknown = sorted(set(ids) - set(wnid_of))
    if unknown:
        raise ValueError(f'{truth_path}: class IDs not in meta.mat: '
                         f'{unknown[:5]}')
    return {f'ILSVRC2012_val_{k:08d}.JPEG': wnid_of[i]
            for k, i in enumerate(ids, 1)}


def plan(val_dir, out_dir, labels):
    """Return ``(moves, sorted before, unlabelled)``: ``[(src, dst)]``
    and two counts.

    Raises:
        FileNotFoundError: If a labelled image is in neither place.
    """
    files = [n for n in os.listdir(val_dir)
             if osp.isfile(osp.join(val_dir, n))]
    by_key = {osp.splitext(n)[0]: n for n in files}
    by_key.update((n, n) for n in files)
    moves, done, missing, used = [], 0, [], set()
    for key, wnid in sorted(labels.items()):
        name = by_key.get(key)
        if name is not None:
            used.add(name)
            moves.append((osp.join(val_dir, name),
                          osp.join(out_dir, wnid, name)))
        elif osp.isfile(osp.join(out_dir, wnid, key if osp.splitext(key)[1]
                                 else key + '.JPEG')):
            done += 1  # sorted by an earlier run
        else:
            missing.append(key)
    if missing:
        raise FileNotFoundError(
            f'{len(missing)} labelled images are neither in {val_dir} nor '
            f'sorted under {out_dir}, e.g. {missing[:3]}')
    return moves, done, len(files) - len(used)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description='Sort the flat ImageNet validation folder into '
        '<wnid>/ class folders')
    parser.add_argument('val_dir', help='the folder of ILSVRC2012_val_*.JPEG')
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument('--devkit', help='the extracted '
                        'ILSVRC2012_devkit_t12 folder (needs scipy)')
    source.add_argument('--labels', help='a file of "<image> <wnid>" lines')
    parser.add_argument('--out', help='where the class folders go '
                        '(default: VAL_DIR itself)')
    parser.add_argument('--copy', action='store_true',
                        help='copy the images instead of moving them')
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    out = args.out or args.val_dir
    try:
        if not osp.isdir(args.val_dir):
            raise FileNotFoundError(f'folder not found: {args.val_dir}')
        labels = read_devkit(args.devkit) if args.devkit else \
            read_labels(args.labels)
        moves, done, left = plan(args.val_dir, out, labels)
    except (FileNotFoundError, RuntimeError, ValueError) as err:
        sys.exit(f'error: {err}')
    transfer = shutil.copy2 if args.copy else shutil.move
    for src, dst in moves:
        os.makedirs(osp.dirname(dst), exist_ok=True)
        transfer(src, dst)
    classes = len(set(labels.values()))
    print(f'{"copied" if args.copy else "moved"} {len(moves)} images into '
          f'{classes} class folders under {out} ({done} already there, '
          f'{left} unlabelled files left in {args.val_dir})')


if __name__ == '__main__':
    main()
