"""Several runs side by side (``comparison.py``): the stages a work dir
holds (final file, else the partial file up to a line cut by a crash),
one table in CSV/JSON/Markdown and one figure."""
import csv
import json

from mmseg_stag.engine.comparison import (read_run_stages, short_labels,
                                          write_comparison)
from mmseg_stag.engine.report import results_record


def stage(i, rnd, cond, miou):
    return dict(stage=i, round=rnd, condition=cond, num_images=1,
                score_name='mIoU', score=miou, details={})


def test_read_run_stages(tmp_path):
    final, partial, empty = (tmp_path / n for n in ('final', 'partial', 'e'))
    for d in (final, partial, empty):
        d.mkdir()
    stages = [stage(0, 1, 'fog', 50.0), stage(1, 1, 'night', 30.0)]
    (final / 'continual_results.json').write_text(json.dumps(
        results_record('segmentation', stages, ['fog', 'night'])))
    (partial / 'continual_results.partial.jsonl').write_text(
        json.dumps(stages[0]) + '\n' + '{"stage": 1, "rou')
    assert read_run_stages(str(final)) == (stages, True)
    assert read_run_stages(str(partial)) == ([stages[0]], False)
    assert read_run_stages(str(empty)) == ([], False)


def test_write_comparison(tmp_path):
    runs = [dict(name='cfg@ck,beta0=100,seed=0', status='finished', seed=0,
                 stages=[stage(0, 1, 'fog', 50.0), stage(1, 1, 'night', 30.0),
                         stage(2, 2, 'fog', 54.0), stage(3, 2, 'night',
                                                         26.0)]),
            dict(name='cfg@ck,beta0=500,seed=0', status='failed: exit 1',
                 seed=0, stages=[stage(0, 1, 'fog', 40.0)])]
    paths = write_comparison(str(tmp_path), runs, prefix='x')
    rows = json.loads(open(paths['json']).read())['runs']
    assert rows[0]['mIoU_mean_over_stages'] == 40.0
    assert rows[0]['mean fog'] == 52.0 and rows[0]['r2 night'] == 26.0
    assert rows[1]['stages_done'] == 1 and rows[1]['mean night'] is None
    with open(paths['csv']) as f:
        table = list(csv.DictReader(f))
    assert table[1]['status'] == 'failed: exit 1'
    assert table[1]['r1 night'] == '' and table[0]['r1 night'] == '30.00'
    md = open(paths['md']).read().splitlines()
    assert md[0] == ('| name | status | stages_done | mIoU_mean_over_stages '
                     '| mean fog | mean night |')
    assert md[3].endswith('| 1 | 40.00 | 40.00 | - |')
    with open(paths['png'], 'rb') as f:
        assert f.read(8) == b'\x89PNG\r\n\x1a\n'
    assert short_labels([r['name'] for r in runs]) == ['beta0=100',
                                                       'beta0=500']
    assert short_labels(['tent']) == ['tent']
