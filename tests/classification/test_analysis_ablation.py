"""Table ablation_design through ``tools/analysis/design_ablation.py`` on
the tiny CIFAR-C stream: five runs per baseline (STAG off, anchor x
label), the table's numbers equal to the runs' results, reuse of finished
runs, bad input."""
import csv
import json
import os.path as osp

import pytest
from cls_helpers import CIFAR, IMAGENET, killable_config, options
from mmengine.config import Config


@pytest.fixture
def design_ablation(load_tool):
    """The command tools/analysis/design_ablation.py, loaded by its path."""
    return load_tool('analysis/design_ablation')


def tiny_config(tmp_path, root, names, method):
    folder = tmp_path / method
    folder.mkdir()
    pattern = IMAGENET if method == 'sar' else CIFAR  # SAR: ImageNet-C only
    return killable_config(pattern.format(f'{method}-stag'),
                           options(root, names, batch_size=20), folder,
                           kill=False)


def test_table_of_variants(tmp_path, stream, names, checkpoint,
                           design_ablation):
    _, root = stream
    rows = ['--row', 'TENT', tiny_config(tmp_path, root, names, 'tent'),
            '--row', 'SAR', tiny_config(tmp_path, root, names, 'sar')]
    work = tmp_path / 'ablation'
    table = design_ablation.main([checkpoint, *rows, '--condition',
                                  names[1], '--work-dir', str(work)])
    assert table['score'] == 'acc'
    for name in ('TENT', 'SAR'):
        assert list(table[name]) == [t for t, _ in design_ablation.VARIANTS]
        for title, stag in design_ablation.VARIANTS:
            slug = title.split(' (')[0].replace(' / ', '-').lower()
            run = work / name.lower() / slug
            res = json.load(open(run / 'continual_results.json'))
            assert [s['condition'] for s in res['stages']] == [names[1]]
            assert table[name][title] == res['stages'][0]['score']
            method = Config.fromfile(str(run / 'run_config.py')) \
                .test_cfg.method
            if stag is None:
                assert 'stag' not in method
            else:
                assert {k: method.stag[k] for k in stag} == stag
    lines = open(work / 'ablation_design.csv').read().splitlines()
    assert lines[0] == 'variant,TENT,SAR' and len(lines) == 6
    assert 'Diagonal / Hard (Ours)' in open(work /
                                            'ablation_design.txt').read()
    assert (work / 'ablation_design.png').stat().st_size > 10000
    stamp = osp.getmtime(work / 'tent' / 'full-soft' /
                         'continual_results.json')
    again = design_ablation.main([checkpoint, *rows, '--condition',
                                  names[1], '--work-dir', str(work)])
    assert again == table  # every run reused
    assert osp.getmtime(work / 'tent' / 'full-soft' /
                        'continual_results.json') == stamp
    data = list(csv.reader(open(work / 'ablation_design.csv')))
    assert float(data[1][1]) == table['TENT']['Baseline (No STAG)']


def test_bad_input(tmp_path, stream, names, checkpoint, design_ablation):
    _, root = stream
    base = tiny_config(tmp_path, root, names, 'tent')
    with pytest.raises(SystemExit):
        design_ablation.main([checkpoint, '--row', 'X', 'missing.py'])
    no_stag = tmp_path / 'nostag.py'
    no_stag.write_text(f"_base_ = [{base!r}]\n"
                       "test_cfg = dict(method=dict(stag=None))\n")
    with pytest.raises(ValueError, match='no test_cfg.method.stag'):
        design_ablation.main([checkpoint, '--row', 'X', str(no_stag),
                              '--work-dir', str(tmp_path / 'w')])
