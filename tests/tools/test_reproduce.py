"""``tools/reproduce.py``: the paper's tables from the configs on disk and
PAPER_RESULTS; two tiny runs of Table 9's configs (one killed mid-way, then
resumed; a third call skips both) collected into the table; the dry run,
the preset, the Ray hand-over and the refusals."""
import json
import os
import os.path as osp
import re
import signal
import sys

import pytest

from run_helpers import killable_config
from seg_helpers import (NVLABS_SEG_CFG, REPO, as_cli, build_from_config,
                         python_path, save_checkpoint, tiny_options)

TABLE9 = ['source', 'bn-adapt', 'bn-adapt-stag', 'tent', 'tent-stag']


@pytest.fixture
def reproduce(load_tool):
    return load_tool('reproduce')


def test_tables_are_the_configs_of_the_paper_scores(reproduce):
    tables = reproduce.find_tables()
    assert all(not t.missing for t in tables.values()), \
        [(t.name, t.missing) for t in tables.values() if t.missing]
    table9 = reproduce.choose_table('table9', tables)
    assert [osp.relpath(c, REPO) for c in table9.configs] == \
        [NVLABS_SEG_CFG.format(m) for m in TABLE9]
    # docs/reproduce.md's counts: a command per model, these per table
    per_paper = {}
    for table in tables.values():
        per_paper[table.paper[:7]] = per_paper.get(table.paper[:7], 0) + \
            len(table.configs)
    assert per_paper == {'Table 9': 5, 'Table 1': 26, 'Table 2': 16,
                         'Table 3': 34, 'Table 4': 22}
    # the data root each table's runs are given is a setting of its configs
    from mmengine.config import Config
    for table in tables.values():
        cfg = Config.fromfile(table.configs[0])
        node = cfg
        key = reproduce.DATA_ROOT_KEYS.get(table.benchmark,
                                           reproduce.CORRUPTION_ROOT_KEY)
        for part in key.split('.'):
            assert part in node, (table.name, key)
            node = node[part]


def test_list_names_every_table(reproduce, capsys):
    assert reproduce.main(['--list']) == 0
    out = capsys.readouterr().out
    assert 'acdc_continual_segformer-b5 (or table9): Table 9, 5 configs' in \
        out
    assert 'imagenet-c_mild_resnet50-gn: Table 1, 8 configs' in out
    assert 'configs/cls/cifar-c/cifar100-c_continual_wrn-40-2_ecotta-k5-' \
        'stag.py' in out


@pytest.fixture
def files(tmp_path):
    ckpt = tmp_path / 'model.pth'
    ckpt.write_bytes(b'')
    data = tmp_path / 'data'
    data.mkdir()
    return ['--checkpoint', str(ckpt), '--data-root', str(data),
            '--work-root', str(tmp_path / 'work')]


def test_dry_run_prints_the_commands_and_runs_nothing(reproduce, files,
                                                      tmp_path, capsys):
    assert reproduce.main(['table9', *files, '--dry-run', '--cfg-options',
                           'test_dataloader.num_workers=1']) == 0
    out = capsys.readouterr().out
    for method in TABLE9:
        stem = f'segformer_mit-b5-nvlabs_acdc-continual_{method}'
        assert f'{stem}.py {tmp_path / "model.pth"} --work-dir ' \
            f'{tmp_path / "work" / stem} --cfg-options ' \
            f'test_dataloader.dataset.data_root={tmp_path / "data"} ' \
            'test_dataloader.num_workers=1\n' in out
    assert 'tools/collect_results.py ' in out and \
        f'--out {tmp_path / "work" / "table"}' in out
    assert '--resume' not in out
    assert not (tmp_path / 'work').exists()


def test_the_preset_runs_each_sibling_and_says_where_none_exists(
        reproduce, files, capsys):
    assert reproduce.main(['table9', *files, '--dry-run', '--preset',
                           'bf16-graph', '--only', 'tent-stag']) == 0
    out = capsys.readouterr().out
    assert 'tent-stag: runs, preset bf16-graph' in out
    assert 'segformer_mit-b5-nvlabs_acdc-continual_tent-stag_bf16-graph.py'\
        in out and '/segformer_mit-b5-nvlabs_acdc-continual_tent-stag_' \
        'bf16-graph --cfg-options' in out
    # collected like the faithful runs, their rows marked by collect
    assert 'collect_results.py' in out
    assert reproduce.main(['imagenet-c_mixed_vit-b16', *files, '--dry-run',
                           '--preset', 'bf16-graph', '--only', 'tent']) == 0
    out = capsys.readouterr().out
    assert 'tent: runs, faithful: configs/cls/imagenet-c/imagenet-c_mixed_' \
        'vit-b16_tent.py has no _bf16-graph sibling' in out
    assert 'corruption_set.data_root=' in out


@pytest.mark.parametrize('argv, message', [
    (['table1'], 'table1 is run one model at a time'),
    (['table7'], "no table 'table7'; the tables: table9, "),
    (['table9', '--only', 'cotta'], '--only cotta: not a config of '
     'acdc_continual_segformer-b5'),
    (['cifar10-c_continual_wrn-28-10'], 'ecotta-k4, ecotta-k5 (and -stag) '
     'start from their warmed-up meta networks'),
    (['table9', '--checkpoint-for', 'eata=x.pth'], 'checkpoint not found: '
     'x.pth'),
    (['table9', '--source-data-root', '.'], '--source-data-root: no run of '
     'acdc_continual_segformer-b5 reads clean source images'),
])
def test_refusals_name_what_is_wrong(reproduce, files, argv, message):
    with pytest.raises(SystemExit, match=re.escape(message)) as err:
        reproduce.main([argv[0], *files, '--dry-run', *argv[1:]])
    assert str(err.value).startswith('error: ')


def test_options_of_another_launcher_are_refused(reproduce, files, capsys):
    with pytest.raises(SystemExit):
        reproduce.main(['table9', *files, '--address', 'auto'])
    assert '--address: only with --launcher ray' in capsys.readouterr().err
    with pytest.raises(SystemExit):
        reproduce.main(['table9', '--work-root', 'w'])
    assert 'give TABLE --checkpoint ... --data-root ...' in \
        capsys.readouterr().err


# -- two tiny runs, end to end --------------------------------------------
@pytest.fixture(scope='module')
def nvlabs_checkpoint(tiny_acdc, tmp_path_factory):
    model, _ = build_from_config(NVLABS_SEG_CFG.format('source'),
                                 tiny_options(tiny_acdc, head='nvlabs'))
    return save_checkpoint(
        model, tmp_path_factory.mktemp('nvlabs') / 'tiny_nvlabs.pth')


@pytest.fixture
def test_configs(tmp_path, reproduce, monkeypatch):
    """A test-only Table 9: its configs by their own names, each inheriting
    the real one; TENT's with the test-only kill hook (inert unless
    KILL_AT_STAGE is set)."""
    folder = tmp_path / 'configs' / 'stag_acdc'
    folder.mkdir(parents=True)
    for method in TABLE9:
        real = NVLABS_SEG_CFG.format(method)
        killable_config(osp.join(REPO, real), {}, folder,
                        kill=method == 'tent', name=osp.basename(real))
    monkeypatch.setattr(reproduce, 'CONFIG_ROOT', str(tmp_path / 'configs'))
    # the runs find the hook (tests/) and what the tests' Python finds
    monkeypatch.setenv('PYTHONPATH', python_path(osp.join(REPO, 'tests'),
                                                 REPO))
    monkeypatch.setenv('CUDA_VISIBLE_DEVICES', '')
    return folder


def test_two_runs_killed_resumed_skipped_and_collected(
        reproduce, test_configs, tiny_acdc, nvlabs_checkpoint, tmp_path,
        monkeypatch, capsys):
    work = tmp_path / 'work'
    argv = ['table9', '--checkpoint', nvlabs_checkpoint, '--data-root',
            tiny_acdc, '--work-root', str(work), '--only', 'source', 'tent',
            '--allow-short', '--cfg-options',
            *as_cli(tiny_options(tiny_acdc, rounds=1, head='nvlabs'))]
    source = work / 'segformer_mit-b5-nvlabs_acdc-continual_source'
    tent = work / 'segformer_mit-b5-nvlabs_acdc-continual_tent'

    # TENT is killed before the 1st batch of its 3rd stage; Source goes on
    monkeypatch.setenv('KILL_AT_STAGE', '2,1')
    assert reproduce.main(argv) == 1
    out = capsys.readouterr().out
    assert f'tent: killed by signal {signal.SIGKILL}' in out
    assert 'source: finished' in out
    assert 'not finished: tent' in out and 'no table' in out
    assert (source / 'continual_results.json').is_file()
    assert not (tent / 'continual_results.json').exists()
    assert (tent / reproduce.STATE_FILE).is_file()
    assert not (work / 'table').exists()

    # the same command again: Source skipped, TENT resumed, the table
    monkeypatch.delenv('KILL_AT_STAGE')
    assert reproduce.main(argv) == 0
    out = capsys.readouterr().out
    assert 'source: finished: skipped' in out
    assert 'tent: resumes (--resume)' in out
    assert 'segformer_mit-b5-nvlabs_acdc-continual_tent.py' in out and \
        f'--work-dir {tent} --resume --cfg-options' in out
    assert 'resumed from' in (tent / 'run.log').read_text()
    assert 'all 2 runs finished' in out
    assert f'the table: {work / "table"}/paper_table.md' in out
    with open(work / 'table' / 'paper_table.json') as f:
        table = json.load(f)
    assert table['benchmark'] == 'acdc'
    assert [(r['method'], r['base_paper']) for r in table['rows']] == \
        [('source', 56.7), ('tent', 52.4)]
    with open(tent / 'continual_results.json') as f:
        assert len(json.load(f)['stages']) == 4
    source_log = (source / 'run.log').read_text()

    # and once more: nothing runs, the table is collected again
    assert reproduce.main(argv) == 0
    out = capsys.readouterr().out
    assert 'source: finished: skipped' in out and \
        'tent: finished: skipped' in out
    assert 'tools/test.py' not in out
    assert (source / 'run.log').read_text() == source_log
    assert 'paper_table.md' in out


def test_allow_short_reaches_collect_results(reproduce, files, monkeypatch,
                                             capsys):
    """Passed on when asked, left out otherwise."""
    assert reproduce.main(['table9', *files, '--dry-run',
                           '--allow-short']) == 0
    out = capsys.readouterr().out
    assert f'--out {files[-1]}/table --allow-short\n' in out
    assert reproduce.main(['table9', *files, '--dry-run']) == 0
    out = capsys.readouterr().out
    assert f'--out {files[-1]}/table\n' in out


def test_ray_gets_the_unfinished_runs_in_their_work_dirs(
        reproduce, files, tmp_path, monkeypatch, capsys):
    """``--launcher ray`` hands tools/sweep.py's runner the runs not yet
    finished, each in ``WORK_ROOT/<config stem>``, the config's own seed,
    resumed where a run state is; its resource flags go through."""
    work = tmp_path / 'work'
    done = work / 'segformer_mit-b5-nvlabs_acdc-continual_source'
    done.mkdir(parents=True)
    monkeypatch.setattr(reproduce, 'run_state', lambda d: 'finished'
                        if d == str(done) else 'new')
    sweep = reproduce.load_sweep()
    handed = {}

    def run_on_ray(runs, args):
        handed.update(runs=runs, args=args)

    monkeypatch.setattr(sweep, 'run_on_ray', run_on_ray)
    monkeypatch.setattr(reproduce, 'load_sweep', lambda: sweep)
    # the checks need a real checkpoint file only
    reproduce.main(['table9', *files, '--launcher', 'ray', '--num-cpus',
                    '2', '--max-concurrent', '1'])
    runs, args = handed['runs'], handed['args']
    assert [r['name'] for r in runs] == [
        f'segformer_mit-b5-nvlabs_acdc-continual_{m}' for m in TABLE9[1:]]
    assert all(r['work_dir'] == str(work / r['name']) and r['seed'] is None
               for r in runs)
    assert args.resume and args.num_cpus == 2 and args.max_concurrent == 1
    assert args.work_dir == str(work)
    assert args.cfg_options == [
        f'test_dataloader.dataset.data_root={tmp_path / "data"}']
    assert 'source: finished: skipped' in capsys.readouterr().out


def test_a_sweep_run_without_a_seed_keeps_the_configs(tmp_path, monkeypatch,
                                                      load_tool):
    """The Ray trial of a reproduce run passes no --seed (the config's
    randomness.seed, as a local run) and adds the run's own options."""
    # the trial imports ray.tune, which subclasses subprocess.Popen: first
    pytest.importorskip('ray.tune', reason="the sweep extra: pip install "
                        "-e '.[sweep]'")
    sweep = load_tool('sweep')
    seen = {}

    class Done:
        pid, returncode = 1, 0

        def poll(self):
            return 0

    def popen(cmd, **kwargs):
        seen['cmd'] = cmd
        return Done()

    monkeypatch.setattr(sweep.subprocess, 'Popen', popen)
    run = dict(name='r', config='c.py', checkpoint='k.pth', seed=None,
               overrides={}, options=['a.b=1'], work_dir=str(tmp_path / 'r'),
               cpus=1, gpus=0)
    sweep.run_trial(dict(run=run, options=['x=2'], resume=True,
                         launcher_variables=[]))
    assert seen['cmd'][1:] == [sweep.TEST_PY, 'c.py', 'k.pth', '--work-dir',
                               str(tmp_path / 'r'), '--cfg-options', 'x=2',
                               'a.b=1']
    assert sys.executable == seen['cmd'][0]
    assert os.path.isfile(tmp_path / 'r' / 'pid')


def test_two_runs_on_a_local_ray(tiny_acdc, nvlabs_checkpoint, tmp_path):
    """``--launcher ray`` end to end (as a command: Ray starts in its own
    process): both runs in their work dirs, the sweep's table beside them,
    the paper's table collected."""
    pytest.importorskip('ray', reason="the sweep extra: pip install -e "
                        "'.[sweep]'")
    import tool_runs
    work = tmp_path / 'work'
    cmd = [sys.executable, osp.join(REPO, 'tools', 'reproduce.py'), 'table9',
           '--checkpoint', nvlabs_checkpoint, '--data-root', tiny_acdc,
           '--work-root', str(work), '--only', 'source', 'tent',
           '--launcher', 'ray', '--num-cpus', '2', '--allow-short',
           '--cfg-options',
           *as_cli(tiny_options(tiny_acdc, rounds=1, head='nvlabs'))]
    env = dict(os.environ, OMP_NUM_THREADS='1', CUDA_VISIBLE_DEVICES='',
               RAY_DEDUP_LOGS='0')
    done = tool_runs.run(cmd, cwd=REPO, env=env, capture_output=True,
                         text=True, timeout=600)
    assert done.returncode == 0, (done.stdout + done.stderr)[-5000:]
    assert 'all 2 runs finished' in done.stdout
    with open(work / 'sweep_results.json') as f:
        rows = json.load(f)['runs']
    assert sorted((r['name'], r['status']) for r in rows) == [
        (f'segformer_mit-b5-nvlabs_acdc-continual_{m}', 'finished')
        for m in ('source', 'tent')]
    for method in ('source', 'tent'):
        assert (work / f'segformer_mit-b5-nvlabs_acdc-continual_{method}' /
                'continual_results.json').is_file()
    with open(work / 'table' / 'paper_table.json') as f:
        assert [r['method'] for r in json.load(f)['rows']] == \
            ['source', 'tent']
