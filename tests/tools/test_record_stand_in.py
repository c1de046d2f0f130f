"""tools/record_stand_in.py reads the demos' outputs, as their own writers
write them, into the rows of the docs' support matrix."""
import json

import pytest

from mmseg_stag.classification.corruption_table import write_corruption_table
from mmseg_stag.engine.comparison import write_comparison


@pytest.fixture
def main(load_tool):
    """The command's ``main``, the script loaded by its path."""
    return load_tool('record_stand_in').main


def stage(score, condition='fog'):
    return dict(round=1, condition=condition, score_name='mIoU',
                score=score, num_images=2)


def cls_row(name, base, acc):
    per = {c: dict(correct=int(acc * 10), total=1000, acc=acc,
                   err=100 - acc) for c in ('fog', 'snow')}
    return dict(name=name, base=base, per_corruption=per, avg_acc=acc,
                avg_err=100 - acc, num_updates=3)


def test_demo_outputs_become_matrix_rows(tmp_path, main):
    demo, demo_cls = tmp_path / 'demo', tmp_path / 'demo_cls'
    write_comparison(str(demo), [
        dict(name='tent', stages=[stage(40.0), stage(42.0, 'night')]),
        dict(name='tent-stag (beta0=1000)', stages=[stage(44.0)])],
        prefix='demo_comparison')
    write_corruption_table(
        str(demo_cls / 'mild_gn'),
        [cls_row('Source', None, 50.0), cls_row('EATA', None, 60.0),
         cls_row('EATA+STAG', 'EATA', 61.0)], ['fog', 'snow'], 'acc',
        meta=dict(scenario='mild', net='gn'))
    write_corruption_table(
        str(demo_cls / 'continual_bn'),
        [cls_row('EcoTTA', None, 70.0)], ['fog', 'snow'], 'err',
        meta=dict(scenario='continual', net='bn'))
    out = tmp_path / 'stand-in.json'
    main(['--measured', 'today', '--demo', str(demo), '--demo-cls',
          str(demo_cls), '--out', str(out)])
    record = json.loads(out.read_text())
    assert record['measured'] == 'today'
    rows = {(r['benchmark'], r['scenario'], r['model'], r['method'],
             r['stag']): r['score'] for r in record['rows']}
    assert rows == {
        ('acdc', 'continual', 'segformer-b5', 'tent', False): 41.0,
        ('acdc', 'continual', 'segformer-b5', 'tent', True): 44.0,
        ('cifar10-c', 'continual', 'wrn-28-10', 'ecotta-k4', False): 30.0,
        ('imagenet-c', 'mild', 'resnet50-gn', 'source', False): 50.0,
        ('imagenet-c', 'mild', 'resnet50-gn', 'eata', False): 60.0,
        ('imagenet-c', 'mild', 'resnet50-gn', 'eata', True): 61.0}


def test_missing_demo_outputs_are_named(tmp_path, main):
    with pytest.raises(FileNotFoundError, match='demo_comparison.json'):
        main(['--measured', 'x', '--demo', str(tmp_path), '--demo-cls',
              str(tmp_path), '--out', str(tmp_path / 'o.json')])


def test_a_row_two_demo_dirs_share_is_kept_once(tmp_path, main):
    """make demo-hybrid's dir repeats make demo's Source and TENT rows (the
    same seeded data and model): kept once; differing scores refused."""
    for name, tent in (('demo', 40.0), ('hybrid', 40.0), ('other', 41.0)):
        write_comparison(str(tmp_path / name), [
            dict(name='tent', stages=[stage(tent)]),
            dict(name='hybrid-tta', stages=[stage(45.0)])],
            prefix='demo_comparison')
    cls_dir = tmp_path / 'demo_cls'
    write_corruption_table(str(cls_dir / 'mild_gn'),
                           [cls_row('Source', None, 50.0)], ['fog', 'snow'],
                           'acc', meta=dict(scenario='mild', net='gn'))
    out = tmp_path / 'stand-in.json'
    main(['--measured', 'today', '--demo', str(tmp_path / 'demo'),
          str(tmp_path / 'hybrid'), '--demo-cls', str(cls_dir), '--out',
          str(out)])
    methods = [r['method'] for r in json.loads(out.read_text())['rows']
               if r['benchmark'] == 'acdc']
    assert methods == ['tent', 'hybrid_tta']
    with pytest.raises(SystemExit, match='scored 41.0, another --demo dir '
                       '40.0'):
        main(['--measured', 'today', '--demo', str(tmp_path / 'demo'),
              str(tmp_path / 'other'), '--demo-cls', str(cls_dir), '--out',
              str(out)])
