"""Cumulative online accuracy per batch of a classification run."""
import csv
import os.path as osp
from typing import Dict, List, Optional

from mmseg_stag.classification.metric import PER_IMAGE_FILE


def read_per_image(work_dir: str) -> List[Dict[str, object]]:
    """A finished run's ``per_image.csv``, the images in stream order."""
    path = osp.join(work_dir, PER_IMAGE_FILE)
    if not osp.isfile(path):
        raise FileNotFoundError(
            f'{work_dir}: no {PER_IMAGE_FILE}, so not a finished '
            'classification run (tools/test.py writes it at the end of a '
            'stream; a demo row cached from before it existed needs a '
            're-run)')
    with open(path, newline='') as f:
        rows = [dict(r) for r in csv.DictReader(f)]
    for r in rows:
        for key in ('image', 'batch', 'stage', 'round', 'correct'):
            r[key] = int(r[key])
    if not rows:
        raise ValueError(f'{path} holds no image')
    return rows


def running_accuracy(rows: List[dict], corruption: Optional[str] = None
                     ) -> Dict[str, list]:
    """The accuracy (%) after each batch of one corruption (default: the
    first): ``corruption`` and per batch ``batch``, ``images``,
    ``accuracy``."""
    if corruption is None:
        corruption = rows[0]['corruption']
    mine = [r for r in rows if r['corruption'] == corruption]
    if not mine:
        seen = sorted({r['corruption'] for r in rows})
        raise ValueError(f'no image of corruption {corruption!r} (the run '
                         f'has {seen})')
    images, accuracy, correct = [], [], 0
    for i, r in enumerate(mine):
        correct += r['correct']
        if i + 1 == len(mine) or mine[i + 1]['batch'] != r['batch']:
            images.append(i + 1)
            accuracy.append(100.0 * correct / (i + 1))
    return dict(corruption=corruption, batch=list(range(1, len(images) + 1)),
                images=images, accuracy=accuracy)
