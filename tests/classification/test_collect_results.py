"""tools/collect_results.py on work dirs of tiny ``tools/test.py`` runs of
the shipped configs (both tasks): the paper's table with the paper's score
beside ours; runs of another protocol or results of another schema are
refused with a clear message before anything is written."""
import csv
import json
import os.path as osp
import shutil

import pytest

from cls_helpers import CIFAR, options
from run_helpers import run_config
from seg_helpers import REPO, SEG_CFG, tiny_options


@pytest.fixture
def cls_runs(tmp_path, stream, names, checkpoint):
    """Finished CIFAR-10-C continual TENT and TENT+STAG runs (tiny CNN)."""
    _, root = stream
    dirs = []
    for method in ('tent', 'tent-stag'):
        work_dir = str(tmp_path / method)
        run_config(CIFAR.format(method), checkpoint, work_dir,
                   options(root, names))
        dirs.append(work_dir)
    return dirs


def test_the_setting_comes_from_the_shipped_config_name(load_tool):
    setting_of = load_tool('paper_tables').setting_of
    assert setting_of('segformer_mit-b5-nvlabs_acdc-continual_bn-adapt-stag'
                      '.py') == dict(benchmark='acdc', scenario='continual',
                                     model='segformer-b5',
                                     method='bn_adapt', stag=True)
    assert setting_of('segformer_mit-b5_acdc-continual_hybrid-tta.py')[
        'model'] == 'segformer-b5-mmseg'
    assert setting_of('imagenet-c_label-shift_resnet50-gn_eata-stag.py') == \
        dict(benchmark='imagenet-c', scenario='label-shift',
             model='resnet50-gn', method='eata', stag=True)
    assert setting_of('cifar100-c_continual_wrn-40-2_ecotta-k4.py')[
        'method'] == 'ecotta-k4'
    assert setting_of('my_config.py') is None


def test_classification_runs_beside_the_paper(tmp_path, cls_runs,
                                              load_tool):
    tool = load_tool('collect_results')
    out = tmp_path / 'table'
    tool.main([*cls_runs, '--out', str(out)])
    with open(out / 'paper_table.json') as f:
        table = json.load(f)
    assert table['benchmark'] == 'cifar10-c' and table['metric'] == 'err'
    [row] = table['rows']
    assert (row['model'], row['method']) == ('wrn-28-10', 'tent')
    # the paper's Table continual_tta: TENT 19.0 -> +STAG 17.4 error %
    assert (row['base_paper'], row['stag_paper']) == (19.0, 17.4)
    assert row['gain_paper'] == 1.6  # written rounded, not 1.6000000000000014
    ours = {}
    for work_dir in cls_runs:
        with open(osp.join(work_dir, 'continual_results.json')) as f:
            acc = json.load(f)['details']['acc_mean_over_corruptions']
        ours[osp.basename(work_dir)] = 100.0 - acc  # error %
    assert row['base_ours'] == pytest.approx(ours['tent'])
    assert row['stag_ours'] == pytest.approx(ours['tent-stag'])
    assert row['gain_ours'] == pytest.approx(ours['tent'] -
                                             ours['tent-stag'], abs=1e-6)
    assert row['gain_ours'] == round(row['gain_ours'], 6)
    text = (out / 'paper_table.md').read_text()
    assert '| wrn-28-10 | tent |' in text and '| 19.0 |' in text
    assert 'error (%)' in text and 'lower is better' in text
    with open(out / 'paper_table.csv') as f:
        assert next(csv.reader(f))[:4] == ['model', 'method', 'base_ours',
                                           'base_paper']
    assert (out / 'paper_table.png').stat().st_size > 0


def test_bad_work_dirs_are_refused_and_nothing_is_written(
        tmp_path, cls_runs, tiny_acdc, tiny_checkpoint, load_tool, capsys):
    tool = load_tool('collect_results')
    out = tmp_path / 'table'
    # a segmentation run (ACDC) beside the classification ones
    seg = str(tmp_path / 'acdc_tent')
    run_config(osp.join(REPO, SEG_CFG.format('tent')), tiny_checkpoint, seg,
               tiny_options(tiny_acdc, rounds=1))
    with pytest.raises(SystemExit, match='ran different protocols '
                       r'\(task: segmentation vs classification\)'):
        tool.main([cls_runs[0], seg, '--out', str(out)])
    # the ACDC run alone: MMSeg's model-zoo B5, which the paper did not run
    tool.main([seg, '--out', str(out)])
    text = (out / 'paper_table.md').read_text()
    assert 'mean mIoU over the stages' in text and 'no paper score' in text
    shutil.rmtree(out)
    # results of an older schema
    old = str(tmp_path / 'old')
    shutil.copytree(cls_runs[1], old)
    path = osp.join(old, 'continual_results.json')
    with open(path) as f:
        record = json.load(f)
    record['schema'] = 1
    with open(path, 'w') as f:
        json.dump(record, f)
    with pytest.raises(SystemExit, match='has results schema 1'):
        tool.main([cls_runs[0], old, '--out', str(out)])
    # an unfinished run, a work dir of no shipped config, the same run twice
    with pytest.raises(SystemExit, match='the run did not finish'):
        tool.main([cls_runs[0], str(tmp_path), '--out', str(out)])
    renamed = str(tmp_path / 'renamed')
    shutil.copytree(cls_runs[0], renamed)
    shutil.move(osp.join(renamed, osp.basename(CIFAR.format('tent'))),
                osp.join(renamed, 'mine.py'))
    with pytest.raises(SystemExit, match='cannot tell the setting'):
        tool.main([renamed, '--out', str(out)])
    with pytest.raises(SystemExit, match='two runs of wrn-28-10 tent'):
        tool.main([cls_runs[0], cls_runs[0], '--out', str(out)])
    assert not out.exists()
