"""``engine.report``: the paper's table and the JSON / CSV / PNG /
partial-jsonl writers, on segmentation stage results (a stage's IoU from
summed areas)."""
import csv
import json
import math

import numpy as np
import pytest
import torch

from mmseg_stag.engine.report import (PARTIAL_FILE, RESULTS_SCHEMA,
                                      append_partial, format_stage_table,
                                      mean_ignoring_nan, read_partial,
                                      read_results, results_record,
                                      write_results, write_torch)
from mmseg_stag.segmentation.evaluation import stage_miou

CLASSES = ('a', 'b', 'c')


def areas(intersect, union, pred, label):
    return np.array([intersect, union, pred, label], dtype=np.float64)


def stage_result(stage, round_, condition, summed, num_images, classes):
    """A segmentation stage in the results schema, as the metric builds
    it from its images' summed areas."""
    miou, per_class = stage_miou(summed, classes)
    return dict(stage=stage, round=round_, condition=condition,
                num_images=num_images, score_name='mIoU', score=miou,
                details=dict(per_class_IoU=per_class))


def test_mean_ignoring_nan():
    assert mean_ignoring_nan([1.0, float('nan'), None, 3.0]) == 2.0
    assert math.isnan(mean_ignoring_nan([float('nan'), None]))
    assert math.isnan(mean_ignoring_nan([]))


def test_stage_result_from_summed_areas():
    # a: 1/2, b: predicted only (IoU 0), c: absent everywhere (excluded)
    res = stage_result(3, 1, 'rain', areas([1, 0, 0], [2, 1, 0], [1, 1, 0],
                                           [2, 0, 0]), 2, CLASSES)
    assert (res['stage'], res['round'], res['condition'],
            res['num_images']) == (3, 1, 'rain', 2)
    assert res['details']['per_class_IoU'] == {'a': 50.0, 'b': 0.0,
                                               'c': None}
    assert res['score'] == pytest.approx(25.0)


def test_format_table_missing_stage():
    stages = [dict(round=1, condition='fog', score_name='mIoU', score=60.0),
              dict(round=1, condition='night', score_name='mIoU',
                   score=40.0),
              dict(round=2, condition='fog', score_name='mIoU', score=50.0)]
    table = format_stage_table(stages, ['fog', 'night'])
    lines = table.splitlines()
    assert lines[0] == 'Round |    fog |  night |   Mean'
    assert lines[1] == '    1 |   60.0 |   40.0 |   50.0'
    assert lines[2] == '    2 |   50.0 |      - |   50.0'
    assert lines[3] == ' Mean |   55.0 |   40.0 |   50.0'
    assert lines[4] == 'mean over 3 stages: 50.0 mIoU'


def test_append_partial_restarts_then_appends(tmp_path):
    out = tmp_path / 'new' / 'dir'  # created
    first = stage_result(0, 1, 'fog', areas([1, 0, 0], [1, 0, 0], [1, 0, 0],
                                            [1, 0, 0]), 1, CLASSES)
    path = append_partial(str(out), first, fresh=True)
    assert path == str(out / PARTIAL_FILE)
    append_partial(str(out), dict(first, stage=1, score=float('nan')))
    lines = [json.loads(line) for line in open(path)]
    assert [r['stage'] for r in lines] == [0, 1]
    assert lines[0]['details']['per_class_IoU'] == {'a': 100.0, 'b': None,
                                                    'c': None}
    assert lines[1]['score'] is None  # JSON has no NaN
    append_partial(str(out), first, fresh=True)  # a new run starts afresh
    assert len(open(path).read().splitlines()) == 1


def test_write_results(tmp_path):
    stages = [
        stage_result(0, 1, 'fog', areas([1, 0, 0], [2, 1, 0], [1, 1, 0],
                                        [2, 0, 0]), 2, CLASSES),
        stage_result(1, 1, 'snow', areas([0, 0, 0], [0, 0, 0], [0, 0, 0],
                                         [0, 0, 0]), 1, CLASSES),
        stage_result(2, 2, 'fog', areas([2, 0, 0], [2, 0, 0], [2, 0, 0],
                                        [2, 0, 0]), 1, CLASSES),
    ]
    record = results_record('segmentation', stages, ['fog', 'snow'],
                            num_updates=7)
    paths = write_results(str(tmp_path / 'out'), record,
                          detail=('per_class_IoU', CLASSES))
    assert set(paths) == {'json', 'csv', 'png'}
    data = json.loads(open(paths['json']).read())
    assert data == read_results(str(tmp_path / 'out'))
    assert (data['schema'], data['task'], data['score_name'],
            data['num_updates'], data['details']) == (
                RESULTS_SCHEMA, 'segmentation', 'mIoU', 7, {})
    assert data['conditions'] == ['fog', 'snow'] and data['rounds'] == 2
    assert [s['stage'] for s in data['stages']] == [0, 1, 2]
    assert data['stages'][1]['score'] is None  # nothing to score: null
    assert data['mean_over_stages'] == pytest.approx((25.0 + 100.0) / 2)
    with open(paths['csv']) as f:
        rows = list(csv.reader(f))
    assert rows[0] == ['stage', 'round', 'condition', 'mIoU', 'a', 'b', 'c',
                       'num_images']
    assert rows[1] == ['0', '1', 'fog', '25.00', '50.00', '0.00', '', '2']
    assert rows[2][3] == '' and rows[2][-1] == '1'
    png = open(paths['png'], 'rb').read()
    assert png[:8] == b'\x89PNG\r\n\x1a\n' and len(png) > 1000


def test_read_results_refuses_other_schemas_and_unfinished_runs(tmp_path):
    with pytest.raises(FileNotFoundError, match='did not finish'):
        read_results(str(tmp_path))
    (tmp_path / 'continual_results.json').write_text(json.dumps(
        dict(stages=[], mean_mIoU=50.0, score='mIoU')))  # schema 1
    with pytest.raises(ValueError, match='schema 1.*run it again'):
        read_results(str(tmp_path))


def test_a_prefix_writes_and_reads_its_own_files(tmp_path):
    """A run's second metric (``prefix``) writes beside the first's plain
    files without touching them; the readers read either."""
    fog = stage_result(0, 1, 'fog', areas([1, 0, 0], [2, 1, 0], [1, 1, 0],
                                          [2, 0, 0]), 2, CLASSES)
    snow = stage_result(0, 1, 'snow', areas([2, 0, 0], [2, 0, 0], [2, 0, 0],
                                            [2, 0, 0]), 1, CLASSES)
    out = str(tmp_path)
    plain = write_results(out, results_record('segmentation', [fog], ['fog']))
    other = write_results(out, results_record('segmentation', [snow],
                                              ['snow']), prefix='b')
    assert {k: p[len(out) + 1:] for k, p in other.items()} == dict(
        json='b_continual_results.json', csv='b_continual_results.csv',
        png='b_continual_miou.png')
    assert set(plain.values()).isdisjoint(other.values())
    assert read_results(out)['conditions'] == ['fog']
    assert read_results(out, prefix='b')['conditions'] == ['snow']
    assert append_partial(out, fog, fresh=True) == str(tmp_path /
                                                        PARTIAL_FILE)
    append_partial(out, snow, fresh=True, prefix='b')
    assert [s['condition'] for s in read_partial(out)] == ['fog']
    assert [s['condition'] for s in read_partial(out, 'b')] == ['snow']


def test_write_torch_makes_its_folder_and_leaves_no_temporary(tmp_path):
    path = tmp_path / 'new' / 'state.pth'
    assert write_torch(str(path), dict(x=torch.arange(3))) == str(path)
    assert torch.equal(torch.load(path, weights_only=True)['x'],
                       torch.arange(3))
    write_torch(str(path), dict(x=torch.zeros(2)))  # replaces it
    assert torch.load(path, weights_only=True)['x'].tolist() == [0.0, 0.0]
    assert sorted(p.name for p in path.parent.iterdir()) == ['state.pth']
