"""Figure running curves: a run's ``per_image.csv`` (written by the
metric), the cumulative accuracy per batch against a direct count, and
``tools/analysis/running_curves.py`` with its files and errors."""
import csv
import json

import pytest
from cls_helpers import CIFAR, options, run
from tool_runs import tool_module

# the curves are the tool's (tools/analysis/running_curves.py)
_TOOL = tool_module('analysis/running_curves')
read_per_image = _TOOL.read_per_image
running_accuracy = _TOOL.running_accuracy


@pytest.fixture
def running_curves(load_tool):
    """The command tools/analysis/running_curves.py, loaded by its path."""
    return load_tool('analysis/running_curves')


def test_per_image_file_and_running_accuracy(tmp_path, stream, names,
                                             checkpoint):
    _, root = stream
    opts = options(root, names, batch_size=16)
    result = run(CIFAR.format('tent'), checkpoint, tmp_path / 'tent', opts)
    rows = read_per_image(str(tmp_path / 'tent'))
    assert [r['image'] for r in rows] == list(range(120))
    assert [r['corruption'] for r in rows] == [c for c in names
                                               for _ in range(40)]
    # batches of 16 never cross a stage: 16, 16, 8 per corruption
    first = [r['batch'] for r in rows if r['corruption'] == names[0]]
    assert first == [0] * 16 + [1] * 16 + [2] * 8
    for c in names:  # the per-image file and the results agree
        assert sum(r['correct'] for r in rows if r['corruption'] == c) == \
            result['details']['per_corruption'][c]['correct']
    curve = running_accuracy(rows, names[1])
    assert curve['batch'] == [1, 2, 3] and curve['images'] == [16, 32, 40]
    mine = [r['correct'] for r in rows if r['corruption'] == names[1]]
    assert curve['accuracy'] == pytest.approx(
        [100 * sum(mine[:n]) / n for n in (16, 32, 40)])
    assert running_accuracy(rows)['corruption'] == names[0]
    with pytest.raises(ValueError, match='no image of corruption'):
        running_accuracy(rows, 'fog')


def test_command_writes_panels(tmp_path, stream, names, checkpoint,
                               running_curves):
    _, root = stream
    opts = options(root, names, batch_size=16)
    for method in ('tent', 'tent-stag'):
        run(CIFAR.format(method), checkpoint, tmp_path / method, opts)
    out = tmp_path / 'out'
    curves = running_curves.main([
        '--panel', 'Tiny CNN, TENT', f'TENT={tmp_path / "tent"}',
        f'TENT+STAG={tmp_path / "tent-stag"}', '--corruption', names[2],
        '--out', str(out)])
    saved = json.load(open(out / 'running_curves.json'))
    assert saved['panels'] == curves
    assert set(curves['Tiny CNN, TENT']) == {'TENT', 'TENT+STAG'}
    rows = list(csv.DictReader(open(out / 'running_curves.csv')))
    assert len(rows) == 2 * 3 and rows[0]['corruption'] == names[2]
    assert (out / 'running_curves.png').stat().st_size > 10000


def test_command_errors(tmp_path, running_curves):
    (tmp_path / 'empty').mkdir()
    with pytest.raises(FileNotFoundError, match='per_image.csv'):
        running_curves.main(['--panel', 'A', f'X={tmp_path / "empty"}',
                             '--out', str(tmp_path)])
    with pytest.raises(SystemExit):
        running_curves.main(['--panel', 'A', 'no-equals-sign'])
    with pytest.raises(SystemExit):
        running_curves.main(['--panel', 'A'])


def test_the_file_is_read_where_the_metric_wrote_it(tmp_path):
    """Behind the metric's file prefix, in its output dir (before, only a
    work dir's plain per_image.csv was looked for)."""
    from mmseg_stag.classification.metric import PER_IMAGE_COLUMNS
    out = tmp_path / 'out'
    out.mkdir()
    with open(out / 'b_per_image.csv', 'w', newline='') as f:
        writer = csv.writer(f)
        writer.writerow(PER_IMAGE_COLUMNS)
        writer.writerow([0, 0, 0, 0, 'fog', 1])
    rows = read_per_image(str(out), 'b')
    assert rows[0]['correct'] == 1 and rows[0]['corruption'] == 'fog'
    with pytest.raises(FileNotFoundError, match='holds b_per_image.csv: '
                       "give the metric's file prefix"):
        read_per_image(str(out))
