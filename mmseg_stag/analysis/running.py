"""Cumulative online accuracy per batch of a classification run."""
import csv
import os
import os.path as osp
from typing import Dict, List, Optional

from mmseg_stag.classification.metric import PER_IMAGE_FILE
from mmseg_stag.engine.report import result_file


def read_per_image(results_dir: str,
                   file_prefix: str = '') -> List[Dict[str, object]]:
    """A finished run's ``per_image.csv``, the images in stream order.

    Args:
        results_dir (str): Where the run's metric wrote its files: its
            ``output_dir`` (``tools/test.py --out``), by default the run's
            work dir.
        file_prefix (str): The metric's ``file_prefix`` (a run with
            several metrics: each but the first writes ``PREFIX_...``).
            Default: '' (the plain name).
    """
    name = result_file(PER_IMAGE_FILE[:-len('.csv')], file_prefix) + '.csv'
    path = osp.join(results_dir, name)
    if not osp.isfile(path):
        others = sorted(n for n in os.listdir(results_dir)
                        if n.endswith('_' + PER_IMAGE_FILE)) \
            if osp.isdir(results_dir) else []
        raise FileNotFoundError(
            f'{results_dir}: no {name}, so not the results of a finished '
            'classification run (tools/test.py writes it at the end of a '
            'stream, in the metric\'s output_dir: the work dir, or --out)'
            + (f'; it holds {", ".join(others)}: give the metric\'s '
               'file prefix' if others else ''))
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
