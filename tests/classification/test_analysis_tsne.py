"""Figure t-SNE through ``tools/analysis/tsne.py`` on the tiny CIFAR-C
stream: the kept features are the classifier inputs of the stage's last
batches (checked against the source model directly), with their labels;
one shared map with the anchors; bad input."""
import json

import numpy as np
import pytest
import torch
from cls_helpers import CIFAR, killable_config, options

from mmseg_stag.classification import CIFARC


@pytest.fixture
def tsne(load_tool):
    """The command tools/analysis/tsne.py, loaded by its path."""
    return load_tool('analysis/tsne')


def config_of(tmp_path, root, names, leaf):
    folder = tmp_path / leaf
    folder.mkdir()
    opts = options(root, names, batch_size=8)
    if leaf == 'source':
        opts.pop('test_cfg.method.optimizer')
    return killable_config(CIFAR.format(leaf), opts, folder, kill=False)


def test_features_labels_and_map(tmp_path, stream, names, checkpoint,
                                 tiny_model, tsne):
    _, root = stream
    rows = []
    for name, leaf in (('Source', 'source'), ('TENT', 'tent'),
                       ('TENT+STAG', 'tent-stag')):
        rows += ['--row', name, config_of(tmp_path, root, names, leaf)]
    work = tmp_path / 'tsne'
    coords = tsne.main([checkpoint, *rows, '--condition', names[2],
                        '--last-batches', '2', '--work-dir', str(work)])
    data = CIFARC(root, names[2], severity=5, n_examples=40)
    labels = [int(data[i][1]) for i in range(24, 40)]  # the last 2 batches
    for name in ('Source', 'TENT', 'TENT+STAG'):
        c = coords[name]
        assert c['label'] == labels
        assert len(c['x']) == 16 and len(c['anchor_x']) == 4
        assert np.isfinite(c['x'] + c['y']).all()
    # Source adapts nothing: its features are the source model's
    model = tiny_model()
    images = torch.stack([data[i][0] for i in range(32, 40)]).float() / 255
    with torch.no_grad():
        direct = model.features(images).mean((2, 3))
    features, y, _, _ = tsne.run_row(
        rows[rows.index('Source') + 1], tsne.parse_args(
            [checkpoint, '--row', 'S', rows[rows.index('Source') + 1],
             '--condition', names[2], '--last-batches', '1']),
        str(tmp_path / 'direct'))
    torch.testing.assert_close(features, direct, rtol=1e-5, atol=1e-6)
    assert y.tolist() == labels[8:]
    saved = json.load(open(work / 'tsne.json'))
    assert saved['rows'] == coords and saved['last_batches'] == 2
    lines = open(work / 'tsne.csv').read().splitlines()
    assert len(lines) == 1 + 3 * (16 + 4)
    assert (work / 'tsne.png').stat().st_size > 10000


def test_bad_input(tmp_path, checkpoint, tsne):
    with pytest.raises(SystemExit):
        tsne.main([checkpoint, '--row', 'X', str(tmp_path / 'none.py')])
    with pytest.raises(SystemExit):
        tsne.main([checkpoint, '--row', 'X', checkpoint, '--last-batches',
                   '0'])
