"""Frames beside their label maps from several ``tools/adapt.py`` runs on
the same input (e.g. Source against an adapting method): one row a frame,
one column a run::

    python tools/adapt_compare.py RUN_DIR [RUN_DIR ...] --frames I [I ...]
        --out FIGURE.png [--names NAME ...] [--ground-truth OLD NEW ...]

Each RUN_DIR is a ``tools/adapt.py --out-dir``; the frames are read from
the files its ``frames.csv`` names (the first run's), the label maps from
its ``labels/`` in their palette colours. Where the frames have labels
(a benchmark's stream), ``--ground-truth`` names them by replacing parts of
each frame's path (pairs OLD NEW) and adds their column.
"""
import argparse
import csv
import os
import os.path as osp
import sys


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description='frames beside the label maps of tools/adapt.py runs')
    parser.add_argument('runs', nargs='+', help='tools/adapt.py --out-dir '
                        'folders, on the same input')
    parser.add_argument('--frames', nargs='+', type=int, required=True,
                        help='frame indices (frames.csv\'s index)')
    parser.add_argument('--names', nargs='+', help='a column title per run '
                        '(default: the folder names)')
    parser.add_argument('--out', required=True, help='the figure (.png)')
    parser.add_argument('--ground-truth', nargs='+', metavar='OLD NEW',
                        help='label maps (train ids) beside the frames: each '
                        'frame\'s path with OLD replaced by NEW, pair by pair')
    args = parser.parse_args(argv)
    if args.ground_truth and len(args.ground_truth) % 2:
        parser.error('--ground-truth takes pairs: OLD NEW [OLD NEW ...]')
    if args.names and len(args.names) != len(args.runs):
        parser.error('--names needs one name per run')
    return args


def frame_files(run):
    """``{index: file}`` of a run's stepped frames (``frames.csv``)."""
    path = osp.join(run, 'frames.csv')
    if not osp.isfile(path):
        raise SystemExit(f'error: {run} is no tools/adapt.py run (no '
                         'frames.csv)')
    with open(path, newline='') as f:
        return {int(r['index']): r['file'] for r in csv.DictReader(f)
                if r['status'] == 'ok'}


def frame_image(name):
    """The frame ``frames.csv`` names as an RGB PIL image: an image file,
    or ``VIDEO#N``, the video's frame N (decoded up to it: codecs seek to
    key frames only)."""
    import cv2
    from PIL import Image
    path, _, number = name.rpartition('#')
    if not (path and number.isdigit()):
        return Image.open(name).convert('RGB')
    if not osp.isfile(path):
        raise SystemExit(f'error: frame {name}: a live input\'s frames are '
                         'not kept (tools/adapt.py --overlay writes them '
                         'with their labels)' if '://' in path or
                         path.isdigit() else f'error: no video {path}')
    capture = cv2.VideoCapture(path)
    try:
        for _ in range(int(number) + 1):
            ok, image = capture.read()
            if not ok:
                raise SystemExit(f'error: {path} has no frame {number}')
    finally:
        capture.release()
    return Image.fromarray(image[..., ::-1])


def palette_png(run, index):
    """A run's label map of frame ``index`` as written (palette PNG)."""
    from PIL import Image
    folder = osp.join(run, 'labels')
    names = [n for n in os.listdir(folder) if n.startswith(f'{index:06d}_')]
    if not names:
        raise SystemExit(f'error: {run} has no label map of frame {index}')
    return Image.open(osp.join(folder, names[0]))


def label_map(run, index):
    """A run's label map of frame ``index`` in its palette colours (RGB)."""
    return palette_png(run, index).convert('RGB')


def ground_truth(path, pairs, palette_of):
    """The label map of frame ``path`` (``pairs`` applied to its path) in
    the palette of ``palette_of`` (a run's label PNG)."""
    from PIL import Image
    for old, new in zip(pairs[::2], pairs[1::2]):
        path = path.replace(old, new)
    if not osp.isfile(path):
        raise SystemExit(f'error: --ground-truth: no label file {path}')
    labels = Image.frombytes('P', *(lambda im: (im.size, im.tobytes()))(
        Image.open(path).convert('L')))
    labels.putpalette(palette_of.getpalette())
    return labels.convert('RGB')


def main(argv=None) -> int:
    args = parse_args(argv)
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    files = frame_files(args.runs[0])
    for run in args.runs[1:]:
        other = frame_files(run)
        if any(other.get(i) != files.get(i) for i in args.frames):
            raise SystemExit(f'error: {run} adapted on other frames than '
                             f'{args.runs[0]} (frames.csv differ)')
    missing = [i for i in args.frames if i not in files]
    if missing:
        raise SystemExit(f'error: no frame {missing} in {args.runs[0]}')
    names = args.names or [osp.basename(osp.normpath(r)) for r in args.runs]
    if args.ground_truth:
        names = names + ['ground truth']
    rows, cols = len(args.frames), len(names) + 1
    fig, axes = plt.subplots(rows, cols, figsize=(3.2 * cols, 1.9 * rows),
                             squeeze=False)
    for r, index in enumerate(args.frames):
        panels = [frame_image(files[index])] + [
            label_map(run, index) for run in args.runs]
        if args.ground_truth:
            panels.append(ground_truth(files[index], args.ground_truth,
                                       palette_png(args.runs[0], index)))
        for c, panel in enumerate(panels):
            ax = axes[r][c]
            ax.imshow(panel)
            ax.set_xticks([])
            ax.set_yticks([])
            if r == 0:
                ax.set_title('frame' if c == 0 else names[c - 1], fontsize=9)
            if c == 0:
                ax.set_ylabel(f'frame {index}', fontsize=8)
    fig.tight_layout()
    os.makedirs(osp.dirname(osp.abspath(args.out)), exist_ok=True)
    fig.savefig(args.out, dpi=110)
    print(f'[adapt_compare] {args.out}')
    return 0


if __name__ == '__main__':
    sys.exit(main())
