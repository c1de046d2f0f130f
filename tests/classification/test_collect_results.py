"""tools/collect_results.py on work dirs of tiny ``tools/test.py`` runs of
the shipped configs (both tasks): the paper's table with the paper's score
beside ours and each run's provenance; runs of another protocol or image
count than the paper's table are refused (or, with ``--allow-short``,
marked), as are results of another schema, before anything is written;
for ACDC every stage beside the paper's and Figure 5; a run whose results
went to ``tools/test.py --out DIR`` is found; the seeds of a setting are
one cell (mean ± sample std); realistic runs are a table of their own
beside the offline one, of one cost setting."""
import csv
import json
import os
import os.path as osp
import re
import shutil
import sys

import pytest
from cls_helpers import CIFAR, options
from mmengine.config import Config
from run_helpers import run_config
from seg_helpers import REPO, SEG_CFG, as_cli, tiny_options

from mmseg_stag.paper.results import ACDC_STAGES

NVLABS_TENT = 'segformer_mit-b5-nvlabs_acdc-continual_{}.py'


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


@pytest.fixture(scope='module')
def seg_run(tiny_acdc, tiny_checkpoint, tmp_path_factory):
    """A finished one-round ACDC TENT run (tiny SegFormer, 2 images a
    stage)."""
    work_dir = str(tmp_path_factory.mktemp('acdc_tent'))
    run_config(osp.join(REPO, SEG_CFG.format('tent')), tiny_checkpoint,
               work_dir, tiny_options(tiny_acdc, rounds=1))
    return work_dir


def edit_results(work_dir, edit):
    path = osp.join(work_dir, 'continual_results.json')
    with open(path) as f:
        record = json.load(f)
    edit(record)
    with open(path, 'w') as f:
        json.dump(record, f)
    return record


def full_acdc_run(seg_run, folder, method, shift=0.0, **provenance):
    """``seg_run``'s results made a whole Table acdc_continual run of the
    NVlabs B5 ``method``: 10 rounds of fog, night, rain, snow, 400 images
    a stage, its scores the paper's plus ``shift`` (a collect's test, not
    a run's)."""
    work_dir = str(folder / method)
    shutil.copytree(seg_run, work_dir)
    for name in os.listdir(work_dir):  # the dumped config: not this one
        if name.endswith('.py'):
            os.remove(osp.join(work_dir, name))
    method_name = method.replace('-stag', '').replace('-', '_')
    paper = ACDC_STAGES[(method_name, method.endswith('-stag'))]

    def edit(record):
        record['stages'] = [
            dict(stage=i, round=i // 4 + 1,
                 condition=('fog', 'night', 'rain', 'snow')[i % 4],
                 num_images=400, score_name='mIoU',
                 score=paper[i] + shift + 1e-9 * i)
            for i in range(40)]
        record['rounds'] = 10
        record['mean_over_stages'] = sum(
            s['score'] for s in record['stages']) / 40
        record['provenance'].update(config=NVLABS_TENT.format(method),
                                    **provenance)
        record['provenance']['dataset']['rounds'] = 10
    edit_results(work_dir, edit)
    return work_dir


def test_the_setting_comes_from_the_shipped_config_name(load_tool):
    from mmseg_stag.paper.tables import setting_of
    assert setting_of('segformer_mit-b5-nvlabs_acdc-continual_bn-adapt-stag'
                      '.py') == dict(benchmark='acdc', scenario='continual',
                                     model='segformer-b5',
                                     method='bn_adapt', stag=True)
    assert setting_of('segformer_mit-b5_acdc-continual_hybrid-tta.py')[
        'model'] == 'segformer-b5-mmseg'
    # a fast preset is the same setting (its provenance says the preset)
    assert setting_of('segformer_mit-b5-nvlabs_acdc-continual_tent-stag_'
                      'bf16-graph.py') == setting_of(
        'segformer_mit-b5-nvlabs_acdc-continual_tent-stag.py')
    assert setting_of('segformer_mit-b5-nvlabs_acdc-continual_source_'
                      'bf16.py') == setting_of(
        'segformer_mit-b5-nvlabs_acdc-continual_source.py')
    assert setting_of('imagenet-c_label-shift_resnet50-gn_eata-stag.py') == \
        dict(benchmark='imagenet-c', scenario='label-shift',
             model='resnet50-gn', method='eata', stag=True)
    assert setting_of('cifar100-c_continual_wrn-40-2_ecotta-k4.py')[
        'method'] == 'ecotta-k4'
    assert setting_of('my_config.py') is None


def test_the_paper_protocols_are_the_shipped_configs(load_tool):
    """PROTOCOLS (what collect checks a run against) holds what the
    configs run: conditions, rounds, split, severity, CIFAR-C's count."""
    from mmseg_stag.paper import tables
    acdc = Config.fromfile(osp.join(
        REPO, 'configs/_base_/datasets/acdc_continual.py'))
    dataset = acdc.test_dataloader.dataset
    protocol = tables.PROTOCOLS[('acdc', 'continual')]
    assert (tuple(dataset.conditions), dataset.rounds, dataset.split,
            dataset.images_per_condition) == (
        protocol['conditions'], protocol['rounds'], 'train', None)
    assert protocol['images'] == 400  # ACDC's train split, each condition
    corruptions = Config.fromfile(osp.join(
        REPO, 'configs/cls/_base_/datasets/corruptions.py')).corruptions
    assert tuple(corruptions) == tables.CORRUPTIONS
    for name, images in (('cifar10-c', 10000), ('cifar100-c', 10000),
                         ('imagenet-c', None)):
        cfg = Config.fromfile(osp.join(
            REPO, f'configs/cls/_base_/datasets/{name}.py'))
        corruption_set = cfg.test_dataloader.dataset.corruption_set
        assert (corruption_set.severity, corruption_set.n_examples) == (
            5, images)
    for (benchmark, scenario), protocol in tables.PROTOCOLS.items():
        if benchmark == 'acdc':
            continue
        cfg = Config.fromfile(osp.join(
            REPO, f'configs/cls/_base_/datasets/{benchmark}_{scenario}.py'))
        # batch size 1 is the mild stream, one image a step
        assert cfg.test_dataloader.dataset.scenario.type == (
            'mild' if scenario == 'bs1' else scenario)
        if benchmark.startswith('cifar'):
            assert protocol['images'] == 10000
        elif scenario == 'mixed':  # the 15 corruptions in one stage
            assert protocol['images'] == 15 * 50000
        else:  # ImageNet-C's 50,000 validation images, each corruption
            assert protocol['images'] == 50000


def test_short_runs_are_refused_naming_the_difference(tmp_path, cls_runs,
                                                      load_tool):
    tool = load_tool('collect_results')
    out = tmp_path / 'table'
    with pytest.raises(SystemExit) as err:
        tool.main([*cls_runs, '--out', str(out)])
    message = str(err.value)
    for work_dir in cls_runs:
        assert work_dir in message
    assert '3 stages (1 round(s) of gaussian_noise' in message
    assert 'the paper 15 (1 round(s) of gaussian_noise' in message
    assert 'images per stage 40, the paper 10000' in message
    assert '--allow-short' in message
    assert not out.exists()


def test_classification_runs_beside_the_paper(tmp_path, cls_runs,
                                              load_tool):
    tool = load_tool('collect_results')
    out = tmp_path / 'table'
    tool.main([*cls_runs, '--out', str(out), '--allow-short'])
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
    assert row['base_ours'] == round(ours['tent'], 2)
    assert row['stag_ours'] == round(ours['tent-stag'], 2)
    assert row['gain_ours'] == round(ours['tent'] - ours['tent-stag'], 2)
    # the short runs are marked, each of them: stages, images, and the
    # severity the tiny stream leaves to the dataset class
    assert row['marks'][0].startswith(
        'base: short: 3 stages (1 round(s) of gaussian_noise, shot_noise, '
        'impulse_noise), the paper 15 (1 round(s) of gaussian_noise, ')
    assert row['marks'][1:3] == [
        'base: short: images per stage 40, the paper 10000',
        'base: short: test_dataloader.dataset.corruption_set.severity=unset,'
        ' the paper 5']
    assert row['marks'][3:] == [m.replace('base', '+STAG', 1)
                                for m in row['marks'][:3]]
    # each run's provenance: commit, precision, preset, device, seed
    for run, work_dir in zip(table['runs'], cls_runs):
        with open(osp.join(work_dir, 'continual_results.json')) as f:
            prov = json.load(f)['provenance']
        assert run['work_dir'] == work_dir
        assert run['commit'] == prov['mmseg_stag']['describe']
        assert (run['precision'], run['preset'], run['seed']) == (
            'float32', None, prov['seed'])
        assert run['device'] == prov['device']['name']
        assert run['provenance'] == prov
    text = (out / 'paper_table.md').read_text()
    assert '| wrn-28-10 | tent |' in text and '| 19.00 |' in text
    assert 'error (%)' in text and 'lower is better' in text
    assert f"| wrn-28-10 tent | {table['runs'][0]['commit']} | float32 |" \
        in text
    assert 'short: 3 stages' in text and '--allow-short' in text
    with open(out / 'paper_table.csv') as f:
        assert next(csv.reader(f))[:4] == ['model', 'method', 'base_ours',
                                           'base_paper']
    assert (out / 'paper_table.png').stat().st_size > 0
    assert not (out / 'continual_graph.png').exists()  # ACDC's figure only


def test_acdc_stages_beside_the_paper_and_figure_5(tmp_path, seg_run,
                                                   load_tool):
    """A whole Table acdc_continual run is collected without
    --allow-short: every stage beside the paper's, Figure 5, the numbers
    rounded; a preset run is marked, the table says the runs differ."""
    tool = load_tool('collect_results')
    runs = [full_acdc_run(seg_run, tmp_path, 'tent', shift=-0.3),
            full_acdc_run(seg_run, tmp_path, 'tent-stag', shift=0.1,
                          mixed_precision='bf16', preset='fast',
                          cuda_graph=True)]
    out = tmp_path / 'table'
    tool.main([*runs, '--out', str(out)])
    table = json.loads((out / 'paper_table.json').read_text())
    [row] = table['rows']
    assert (row['base_paper'], row['stag_paper'], row['gain_paper']) == (
        52.4, 57.2, 4.8)
    means = {m: sum(ACDC_STAGES[m]) / 40 for m in (('tent', False),
                                                   ('tent', True))}
    assert row['base_ours'] == round(means[('tent', False)] - 0.3, 2)
    assert row['gain_ours'] == round(means[('tent', True)] + 0.1 -
                                     means[('tent', False)] + 0.3, 2)
    assert row['marks'] == ['+STAG: bf16 autocast', '+STAG: preset fast',
                            '+STAG: CUDA graph']
    assert 'precision: bf16, float32' in table['mixed'][0]
    assert len(table['stages']) == 40
    for i, stage in enumerate(table['stages']):
        assert stage['segformer-b5 tent paper'] == ACDC_STAGES[
            ('tent', False)][i]
        assert stage['segformer-b5 tent+STAG paper'] == ACDC_STAGES[
            ('tent', True)][i]
        assert stage['segformer-b5 tent ours'] == round(
            ACDC_STAGES[('tent', False)][i] - 0.3 + 1e-9 * i, 2)
    # the scores written are rounded: no 0.7999999999999972
    with open(out / 'paper_table_stages.csv') as f:
        cells = [c for line in list(csv.reader(f))[1:] for c in line[3:]]
    written = cells + [str(v) for v in row.values()
                       if isinstance(v, float)] + [
        str(s['score']) for s in table['runs']]
    assert len(written) == 40 * 4 + 6 + 2
    assert all(len(v.partition('.')[2]) <= 2 for v in written), written
    md = (out / 'paper_table.md').read_text()
    assert '| 10 | snow | 48.00 | 48.30 | 58.10 | 58.00 |' in md
    assert 'the runs differ in precision: bf16, float32' in md
    with open(out / 'paper_table_stages.csv') as f:
        assert len(list(csv.reader(f))) == 41
    assert (out / 'continual_graph.png').stat().st_size > 0


def test_acdc_of_another_split_or_stream_is_refused(tmp_path, seg_run,
                                                    load_tool):
    tool = load_tool('collect_results')
    val = full_acdc_run(seg_run, tmp_path, 'tent')
    edit_results(val, lambda r: r['provenance']['dataset'].update(
        split='val'))
    out = tmp_path / 'table'
    with pytest.raises(SystemExit, match=r"split='val', the paper 'train'"):
        tool.main([val, '--out', str(out)])
    # the tiny one-round run: 4 stages of 2 images
    with pytest.raises(SystemExit) as err:
        tool.main([seg_run, '--out', str(out)])
    assert '4 stages (1 round(s) of fog, night, rain, snow), the paper 40 ' \
        '(10 round(s)' in str(err.value)
    assert 'images per stage 2, the paper 400' in str(err.value)
    assert not out.exists()
    tool.main([seg_run, '--out', str(out), '--allow-short'])
    md = (out / 'paper_table.md').read_text()
    assert 'base: short: images per stage 2, the paper 400' in md
    assert (out / 'continual_graph.png').stat().st_size > 0


def test_results_of_test_py_out_are_found(tmp_path, tiny_acdc,
                                          tiny_checkpoint, load_tool,
                                          monkeypatch):
    """``tools/test.py ... --work-dir W --out DIR`` (DIR relative): collect
    finds the results from W (the config dumped there names DIR, made
    absolute) or from DIR itself (the results name their config)."""
    config = osp.join(REPO, SEG_CFG.format('tent'))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, 'argv', [
        'tools/test.py', config, tiny_checkpoint, '--work-dir', 'work',
        '--out', 'results', '--cfg-options',
        *as_cli(tiny_options(tiny_acdc, rounds=1))])
    load_tool('test').main()
    assert not (tmp_path / 'work' / 'continual_results.json').exists()
    assert (tmp_path / 'results' / 'continual_results.json').is_file()
    monkeypatch.chdir(REPO)  # collect run from elsewhere
    tool = load_tool('collect_results')
    for given in ('work', 'results'):
        out = tmp_path / f'table_{given}'
        tool.main([str(tmp_path / given), '--out', str(out),
                   '--allow-short'])
        [run] = json.loads((out / 'paper_table.json').read_text())['runs']
        assert run['results_dir'] == str(tmp_path / 'results')
        assert run['config'] == osp.basename(config)


def test_bad_work_dirs_are_refused_and_nothing_is_written(
        tmp_path, cls_runs, seg_run, load_tool):
    tool = load_tool('collect_results')
    out = tmp_path / 'table'
    # a segmentation run (ACDC) beside the classification ones
    with pytest.raises(SystemExit, match='ran different protocols '
                       r'\(task: segmentation vs classification\)'):
        tool.main([cls_runs[0], seg_run, '--out', str(out),
                   '--allow-short'])
    # the ACDC run alone: MMSeg's model-zoo B5, which the paper did not run
    tool.main([seg_run, '--out', str(out), '--allow-short'])
    text = (out / 'paper_table.md').read_text()
    assert 'mean mIoU over the stages' in text and 'no paper score' in text
    shutil.rmtree(out)
    # results of an older schema
    old = str(tmp_path / 'old')
    shutil.copytree(cls_runs[1], old)
    edit_results(old, lambda r: r.update(schema=1))
    with pytest.raises(SystemExit, match='has results schema 1'):
        tool.main([cls_runs[0], old, '--out', str(out), '--allow-short'])
    # an unfinished run, a run of no shipped config, the same run twice
    with pytest.raises(SystemExit, match='the run did not finish'):
        tool.main([cls_runs[0], str(tmp_path), '--out', str(out),
                   '--allow-short'])
    renamed = str(tmp_path / 'renamed')
    shutil.copytree(cls_runs[0], renamed)
    edit_results(renamed, lambda r: r['provenance'].update(config='mine.py'))
    with pytest.raises(SystemExit, match='cannot tell the setting.*'
                       r'provenance.config\): mine.py'):
        tool.main([renamed, '--out', str(out), '--allow-short'])
    # results written before the provenance: the dumped config tells the
    # setting, and the row is marked
    before = str(tmp_path / 'before')
    shutil.copytree(cls_runs[0], before)
    edit_results(before, lambda r: r.pop('provenance'))
    tool.main([before, '--out', str(out), '--allow-short'])
    assert 'no provenance' in (out / 'paper_table.md').read_text()
    shutil.rmtree(out)
    with pytest.raises(SystemExit, match='two runs of wrn-28-10 tent'):
        tool.main([cls_runs[0], cls_runs[0], '--out', str(out),
                   '--allow-short'])
    assert not out.exists()


# -- seeds and the realistic protocol -----------------------------------------
def realtime_record(how='given', cost=2.5, adapted=5360, batches=16000):
    """A whole ACDC run's ``realtime`` entry (period 3: 134 of each
    stage's 400 batches adapt)."""
    return dict(cost=cost, how=how, period=3, batches_adapted=adapted,
                batches_predicted_only=batches - adapted,
                measured=None if how == 'given' else dict(
                    step_seconds=0.25, forward_seconds=0.1))


def acdc_run(seg_run, folder, method, shift=0.0, seed=0, realtime=None):
    """:func:`full_acdc_run` of ``seed``, realistic where ``realtime``
    says (its results' entry); its mean score."""
    folder.mkdir(exist_ok=True)
    work_dir = full_acdc_run(seg_run, folder, method, shift, seed=seed)
    if realtime is not None:
        edit_results(work_dir, lambda r: r.update(realtime=realtime))
    with open(osp.join(work_dir, 'continual_results.json')) as f:
        return work_dir, json.load(f)['mean_over_stages']


def test_seeds_of_a_setting_are_one_cell_mean_and_std(tmp_path, seg_run,
                                                      load_tool, capsys):
    """Three seeds of TENT and of TENT+STAG: each cell the mean ± the
    sample standard deviation (ddof=1) of its seeds, the gain of the
    means, every stage the mean; one seed shows no ±; two runs of one
    seed are refused."""
    import statistics
    tool = load_tool('collect_results')
    shifts = {'tent': (-0.3, 0.1, 0.5), 'tent-stag': (0.2, 0.0, -0.7)}
    dirs, scores = [], {}
    for method, by_seed in shifts.items():
        for seed, shift in enumerate(by_seed):
            work_dir, score = acdc_run(seg_run, tmp_path / f's{seed}',
                                       method, shift, seed)
            dirs.append(work_dir)
            scores.setdefault(method, []).append(score)
    out = tmp_path / 'table'
    tool.main([*dirs, '--out', str(out)])
    printed = capsys.readouterr().out
    table = json.loads((out / 'paper_table.json').read_text())
    [row] = table['rows']
    mean = {m: statistics.fmean(v) for m, v in scores.items()}
    std = {m: statistics.stdev(v) for m, v in scores.items()}
    assert (row['base_ours'], row['base_ours_std'], row['base_seeds']) == (
        round(mean['tent'], 2), round(std['tent'], 2), [0, 1, 2])
    assert (row['stag_ours'], row['stag_ours_std'], row['stag_seeds']) == (
        round(mean['tent-stag'], 2), round(std['tent-stag'], 2), [0, 1, 2])
    assert row['gain_ours'] == round(mean['tent-stag'] - mean['tent'], 2)
    assert round(std['tent'], 2) == 0.4  # the shifts' own std: the scores'
    assert len(table['runs']) == 6 and len(row['work_dirs']) == 6
    md = (out / 'paper_table.md').read_text()
    cells = (f"| segformer-b5 | tent | {mean['tent']:.2f} ± "
             f"{std['tent']:.2f} | 52.40 | {mean['tent-stag']:.2f} ± "
             f"{std['tent-stag']:.2f} | 57.20 |")
    assert cells in md and cells in printed
    assert 'ours: the mean ± the sample standard deviation (ddof=1) over 3 ' \
        'seeds (0, 1, 2); a gain: the difference of the means' in md
    assert table['seeds'].startswith('ours: the mean ±')
    paper = ACDC_STAGES[('tent', False)]
    for i, stage in enumerate(table['stages']):
        assert stage['segformer-b5 tent ours'] == round(statistics.fmean(
            paper[i] + s + 1e-9 * i for s in shifts['tent']), 2)
    with open(out / 'paper_table.csv') as f:
        head, line = list(csv.reader(f))
    assert head[8:] == ['base_ours_std', 'stag_ours_std', 'base_seeds',
                        'stag_seeds', 'marks']
    assert line[8:12] == [str(round(std['tent'], 2)),
                          str(round(std['tent-stag'], 2)), '0 1 2', '0 1 2']
    # one seed each: no ±
    one = tmp_path / 'one'
    tool.main([dirs[0], dirs[3], '--out', str(one)])
    md = (one / 'paper_table.md').read_text()
    assert '±' not in md and f"| {scores['tent'][0]:.2f} | 52.40 |" in md
    # fewer seeds in one cell: each cell says how many
    fewer = tmp_path / 'fewer'
    tool.main([*dirs[:5], '--out', str(fewer)])
    md = (fewer / 'paper_table.md').read_text()
    assert '(n=3) | 52.40 |' in md and '(n=2) | 57.20 |' in md
    assert "over each cell's seeds" in md
    # two runs of one seed
    twin = tmp_path / 'twin'
    shutil.copytree(dirs[0], twin)
    with pytest.raises(SystemExit, match='two runs of segformer-b5 tent, '
                       'both of seed 0'):
        tool.main([dirs[0], str(twin), '--out', str(tmp_path / 'no')])
    assert not (tmp_path / 'no').exists()


def test_realistic_runs_are_tabled_beside_the_offline_ones(
        tmp_path, seg_run, load_tool, capsys):
    """Runs with ``realtime`` and runs without: two tables side by side,
    paper_table.* and paper_table_realtime.*, the realistic one headed
    with its cost and each run's share of batches adapted."""
    tool = load_tool('collect_results')
    offline = [acdc_run(seg_run, tmp_path / 'off', m, 0.1)[0]
               for m in ('tent', 'tent-stag')]
    realistic = [acdc_run(seg_run, tmp_path / 'rt', m, -2.0,
                          realtime=realtime_record(adapted=a))[0]
                 for m, a in (('tent', 5360), ('tent-stag', 5360))]
    out = tmp_path / 'table'
    tool.main([*offline, *realistic, '--out', str(out)])
    printed = capsys.readouterr().out
    off = json.loads((out / 'paper_table.json').read_text())
    real = json.loads((out / 'paper_table_realtime.json').read_text())
    assert (off['protocol'], off['realtime']) == ('offline', None)
    assert (real['protocol'], real['realtime']) == (
        'realtime', 'a step costs 2.5 forwards (given)')
    assert [r['work_dir'] for r in off['runs']] == offline
    assert [r['work_dir'] for r in real['runs']] == realistic
    assert off['rows'][0]['base_ours'] == round(
        sum(ACDC_STAGES[('tent', False)]) / 40 + 0.1, 2)
    assert real['rows'][0]['base_ours'] == round(
        sum(ACDC_STAGES[('tent', False)]) / 40 - 2.0, 2)
    assert (real['runs'][0]['realtime_cost'], real['runs'][0]['batches'],
            real['runs'][0]['batches_adapted']) == (2.5, 16000, 5360)
    md = (out / 'paper_table_realtime.md').read_text()
    assert md.startswith('realistic protocol (test_cfg.realtime, '
                         'docs/realtime.md): a step costs 2.5 forwards '
                         '(given);')
    assert "The paper's scores are offline (every batch adapts)." in md
    assert 'batches adapted per run: segformer-b5 tent: cost 2.5, 33.5% of ' \
        'the batches adapted (5,360 of 16,000); segformer-b5 tent+STAG: ' in md
    assert 'realistic' not in (out / 'paper_table.md').read_text()
    assert printed.index('acdc, continual: mean mIoU') < \
        printed.index('realistic protocol')
    for name in ('paper_table', 'paper_table_realtime'):
        for ext in ('.md', '.csv', '.png', '_stages.csv'):
            assert (out / f'{name}{ext}').is_file()
    assert (out / 'continual_graph.png').is_file()
    assert (out / 'continual_graph_realtime.png').is_file()
    # the realistic runs alone: their table alone
    alone = tmp_path / 'alone'
    tool.main([*realistic, '--out', str(alone)])
    assert sorted(os.listdir(alone)) == [
        'continual_graph_realtime.png', 'paper_table_realtime.csv',
        'paper_table_realtime.json', 'paper_table_realtime.md',
        'paper_table_realtime.png', 'paper_table_realtime_stages.csv']
    capsys.readouterr()


def test_realistic_runs_of_different_costs_are_refused(tmp_path, seg_run,
                                                       load_tool):
    """One realistic table, one cost setting: a given cost, or measured
    ones (each run's own cost), never two costs or a given beside a
    measured one; nothing is written."""
    tool = load_tool('collect_results')
    given = acdc_run(seg_run, tmp_path / 'a', 'tent',
                     realtime=realtime_record())[0]
    other = acdc_run(seg_run, tmp_path / 'b', 'tent-stag',
                     realtime=realtime_record(cost=3.0))[0]
    measured = [acdc_run(seg_run, tmp_path / d, m, realtime=realtime_record(
        'measured', cost=c))[0] for d, m, c in (
            ('c', 'tent', 2.31), ('d', 'tent-stag', 2.47))]
    out = tmp_path / 'table'
    with pytest.raises(SystemExit) as err:
        tool.main([given, other, '--out', str(out)])
    assert str(err.value) == (
        'error: runs of different realistic protocols (test_cfg.realtime): '
        f'a step costs 2.5 forwards (given): {given}; a step costs 3 '
        f'forwards (given): {other}; a realistic table holds runs of one '
        'cost setting (one given cost, or all measured): collect them apart')
    with pytest.raises(SystemExit, match="measured on each run's first "
                       f'batch: {re.escape(measured[0])}'):
        tool.main([given, measured[0], '--out', str(out)])
    assert not out.exists()
    tool.main([*measured, '--out', str(out)])
    md = (out / 'paper_table_realtime.md').read_text()
    assert "a step's cost measured on each run's first batch" in md
    assert 'segformer-b5 tent: cost 2.31 (measured), 33.5% of the batches ' \
        'adapted' in md
