"""``tools/reproduce.py``: the paper's tables from the configs on disk and
PAPER_RESULTS; two tiny runs of Table 9's configs (one killed mid-way, then
resumed; a third call skips both; a fourth with another seed is refused)
collected into the table; the work dirs (tools/test.py's) and the tables'
folders; the fingerprint check; the progress lines; the dry run, the
preset (refused without CUDA), the Ray hand-over and the refusals; the
realistic protocol (--realtime) and the seeds (--seeds): their work dirs,
tables and fingerprints, and two realistic seeds run, skipped and
collected."""
import json
import os
import os.path as osp
import re
import shlex
import signal
import subprocess
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
        f'--out {tmp_path / "work" / "tables" / "table9"}\n' in out
    assert '--resume' not in out
    assert not (tmp_path / 'work').exists()


def test_the_preset_runs_each_configs_fast_sibling(reproduce, files,
                                                  capsys):
    """``--preset fast``: ``_bf16-graph`` where the step is a CUDA graph,
    ``_bf16`` where not, in the preset's own work dirs and table folder;
    a config with no sibling (or two) is refused by name."""
    assert reproduce.main(['table9', *files, '--dry-run', '--preset',
                           'fast', '--only', 'source', 'tent-stag']) == 0
    out = capsys.readouterr().out
    assert 'tent-stag: runs, preset fast' in out
    stem = 'segformer_mit-b5-nvlabs_acdc-continual_'
    for sibling in ('source_bf16', 'tent-stag_bf16-graph'):
        assert f'{stem}{sibling}.py' in out and \
            f'/{stem}{sibling} --cfg-options' in out
    # collected like the faithful runs (collect marks their rows), apart
    assert f'--out {files[-1]}/tables/table9_fast_only-source+tent-stag\n' \
        in out
    with pytest.raises(SystemExit, match=re.escape(
            'error: --preset fast: configs/cls/imagenet-c/imagenet-c_mixed_'
            'vit-b16_tent.py: no fast sibling (imagenet-c_mixed_vit-b16_tent_'
            'bf16-graph.py or imagenet-c_mixed_vit-b16_tent_bf16.py)')):
        reproduce.main(['imagenet-c_mixed_vit-b16', *files, '--dry-run',
                        '--preset', 'fast', '--only', 'tent'])


def test_a_config_with_two_fast_siblings_is_refused(reproduce, tmp_path):
    config = tmp_path / 'a_tent.py'
    for name in ('a_tent.py', 'a_tent_bf16.py', 'a_tent_bf16-graph.py'):
        (tmp_path / name).write_text('')
    with pytest.raises(SystemExit, match='2 fast siblings'):
        reproduce.preset_configs([str(config)], 'fast')
    (tmp_path / 'a_tent_bf16.py').unlink()
    assert reproduce.preset_configs([str(config)], 'fast') == {
        str(config): str(tmp_path / 'a_tent_bf16-graph.py')}


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
            '--allow-short', '--progress-every', '0.5', '--cfg-options',
            *as_cli(tiny_options(tiny_acdc, rounds=1, head='nvlabs'))]
    source = work / 'segformer_mit-b5-nvlabs_acdc-continual_source'
    tent = work / 'segformer_mit-b5-nvlabs_acdc-continual_tent'
    table = work / 'tables' / 'table9_only-source+tent'
    # a faithful table of the whole Table 9, which a subset leaves alone
    faithful = work / 'tables' / 'table9' / 'paper_table.md'
    faithful.parent.mkdir(parents=True)
    faithful.write_text('the faithful table\n')

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
    assert not table.exists()
    # MMEngine's log lines, as the console's progress reads them
    progress = reproduce.read_progress((source / 'run.log').read_text())
    assert progress.batches == progress.num_batches == 8
    assert progress.images_per_s > 0
    assert re.search(r'\[reproduce\] source: (starting|\d+/8 images)', out)

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
    assert f'the table: {table}/paper_table.md' in out
    with open(table / 'paper_table.json') as f:
        rows = json.load(f)
    assert rows['benchmark'] == 'acdc'
    assert [(r['method'], r['base_paper']) for r in rows['rows']] == \
        [('source', 56.7), ('tent', 52.4)]
    assert faithful.read_text() == 'the faithful table\n'
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
    written = (table / 'paper_table.md').read_text()

    # another seed in the same work root: neither skipped nor tabled, and
    # refused before anything runs
    with pytest.raises(SystemExit) as err:
        reproduce.main(argv + ['randomness.seed=1'])
    message = str(err.value)
    for run in (source, tent):
        assert f'{run} holds a finished run other than' in message
    assert message.count('randomness.seed: 0 -> 1') == 2
    assert 'another --work-root' in message
    assert (source / 'run.log').read_text() == source_log
    assert (table / 'paper_table.md').read_text() == written


def test_allow_short_reaches_collect_results(reproduce, files, monkeypatch,
                                             capsys):
    """Passed on when asked, left out otherwise."""
    assert reproduce.main(['table9', *files, '--dry-run',
                           '--allow-short']) == 0
    out = capsys.readouterr().out
    assert f'--out {files[-1]}/tables/table9 --allow-short\n' in out
    assert reproduce.main(['table9', *files, '--dry-run']) == 0
    out = capsys.readouterr().out
    assert f'--out {files[-1]}/tables/table9\n' in out


def test_ray_gets_the_unfinished_runs_in_their_work_dirs(
        reproduce, files, tmp_path, monkeypatch, capsys):
    """``--launcher ray`` hands tools/sweep.py's runner the runs not yet
    finished, each in ``WORK_ROOT/<config stem>``, the config's own seed,
    resumed where a run state is, the sweep's files in the table's folder;
    its resource flags go through."""
    work = tmp_path / 'work'
    done = work / 'segformer_mit-b5-nvlabs_acdc-continual_source'
    done.mkdir(parents=True)
    monkeypatch.setattr(reproduce, 'on_disk', lambda d: reproduce.OnDisk(
        'finished' if d == str(done) else 'new'))
    # the fingerprints: test_a_run_of_other_options_stops_the_command
    monkeypatch.setattr(reproduce, 'check_fingerprints', lambda runs: None)
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
    assert args.work_dir == str(work / 'tables' / 'table9')
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
    table = work / 'tables' / 'table9_only-source+tent'
    with open(table / 'sweep_results.json') as f:
        rows = json.load(f)['runs']
    assert sorted((r['name'], r['status']) for r in rows) == [
        (f'segformer_mit-b5-nvlabs_acdc-continual_{m}', 'finished')
        for m in ('source', 'tent')]
    for method in ('source', 'tent'):
        assert (work / f'segformer_mit-b5-nvlabs_acdc-continual_{method}' /
                'continual_results.json').is_file()
    with open(table / 'paper_table.json') as f:
        assert [r['method'] for r in json.load(f)['rows']] == \
            ['source', 'tent']


# -- where runs and tables go -------------------------------------------
def test_the_names_it_spells_are_the_engines(reproduce):
    """The file names and presets reproduce.py spells (so that --help
    imports no torch) are the online loop's."""
    from mmseg_stag.engine import report, run_state, speed_options
    assert reproduce.STATE_FILE == run_state.STATE_FILE
    assert reproduce.RESULTS_FILE == report.RESULTS_FILE
    assert tuple(reproduce.PRESETS) == speed_options.PRESETS


def test_help_imports_no_torch():
    """The docstring's claim: --help answers before torch is imported."""
    code = ('import runpy, sys\nsys.argv = ["reproduce.py", "--help"]\n'
            'try:\n    runpy.run_path('
            f'{osp.join(REPO, "tools", "reproduce.py")!r}, '
            'run_name="__main__")\nexcept SystemExit:\n    pass\n'
            'print("torch" in sys.modules)')
    done = subprocess.run([sys.executable, '-c', code], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == 'False'


def test_a_run_goes_where_test_py_puts_it_by_default(reproduce, files,
                                                     tmp_path, monkeypatch,
                                                     capsys):
    """Without --work-root each run goes to tools/test.py's own default
    without --work-dir (prepare_config: ./work_dirs/<config stem>), so a
    run made by hand from the docs is found; the table beside, under
    work_dirs/tables/."""
    from mmengine.config import Config

    from mmseg_stag.engine.runs import prepare_config
    monkeypatch.chdir(tmp_path)
    argv = [a for a in files if a not in files[-2:]]  # no --work-root
    assert reproduce.main(['table9', *argv, '--dry-run', '--only',
                           'tent']) == 0
    out = capsys.readouterr().out
    config = osp.join(REPO, NVLABS_SEG_CFG.format('tent'))
    default = prepare_config(Config.fromfile(config), None, config).work_dir
    assert f'--work-dir {osp.abspath(default)} ' in out
    assert osp.abspath(default) == str(
        tmp_path / 'work_dirs' / osp.splitext(osp.basename(config))[0])
    assert f'--out {tmp_path}/work_dirs/tables/table9_only-tent\n' in out


def test_the_tables_folders(reproduce):
    """Each table, preset and subset its own folder; the same runs the
    same folder (the --only order, all of them: the whole table)."""
    table = reproduce.choose_table('table9', reproduce.find_tables())
    all5 = [reproduce.label(c) for c in table.configs]

    def folder(preset=None, only=None, realtime=None, seed=None, seeds=1):
        args = reproduce.argparse.Namespace(
            work_root='w', preset=preset, only=only, realtime=realtime,
            seed=seed, seeds=seeds)
        return osp.relpath(reproduce.table_dir(table, args), 'w')

    assert folder() == folder(only=all5) == 'tables/table9'
    assert folder('fast') == 'tables/table9_fast'
    assert folder(only=['tent', 'source']) == \
        folder(only=['source', 'tent']) == 'tables/table9_only-source+tent'
    assert folder('fast', ['tent-stag']) == 'tables/table9_fast_only-tent-stag'
    # the protocol and the seeds: a table of their own each
    assert folder(realtime=2.5) == 'tables/table9_realtime-2.5'
    assert folder(realtime=3.0) == 'tables/table9_realtime-3'
    assert folder(realtime=2.5000001) == 'tables/table9_realtime-2.5000001'
    assert folder(realtime='measure') == 'tables/table9_realtime-measure'
    assert folder(seeds=3) == 'tables/table9_seeds3'
    assert folder(seed=5) == 'tables/table9_seed5'
    assert folder('fast', ['tent'], 'measure', 5, 2) == \
        'tables/table9_fast_realtime-measure_seed5_seeds2_only-tent'


@pytest.fixture
def no_runs(reproduce, monkeypatch):
    """Every run finished at once (none starts); collect_results.py writes
    a table that says which command made it."""
    monkeypatch.setattr(reproduce, 'run_local', lambda runs, args: None)
    monkeypatch.setattr(reproduce, 'run_state', lambda work_dir: 'finished')
    monkeypatch.setattr(reproduce, 'cuda_available', lambda: True)

    def collect(cmd, **kwargs):
        out = cmd[cmd.index('--out') + 1]
        os.makedirs(out, exist_ok=True)
        with open(osp.join(out, 'paper_table.md'), 'w') as f:
            f.write(shlex.join(cmd))
        return subprocess.CompletedProcess(cmd, 0)

    monkeypatch.setattr(reproduce.subprocess, 'run', collect)


def test_a_preset_or_subset_leaves_the_faithful_table_alone(
        reproduce, files, no_runs, capsys):
    work = files[-1]
    assert reproduce.main(['table9', *files]) == 0
    faithful = osp.join(work, 'tables', 'table9', 'paper_table.md')
    with open(faithful) as f:
        written = f.read()
    for extra, folder in ((['--preset', 'fast'], 'table9_fast'),
                          (['--only', 'source', 'tent'],
                           'table9_only-source+tent')):
        assert reproduce.main(['table9', *files, *extra]) == 0
        assert osp.isfile(osp.join(work, 'tables', folder, 'paper_table.md'))
        with open(faithful) as f:
            assert f.read() == written
    capsys.readouterr()


def test_a_preset_without_cuda_is_refused_before_any_run(
        reproduce, files, monkeypatch):
    import torch
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: False)

    def no_run(*args, **kwargs):
        raise AssertionError('a run started')

    monkeypatch.setattr(reproduce.subprocess, 'Popen', no_run)
    monkeypatch.setattr(reproduce.subprocess, 'run', no_run)
    with pytest.raises(SystemExit, match=re.escape(
            'error: --preset fast runs on a CUDA GPU and this machine has '
            'none (torch.cuda.is_available() is False): run the table '
            'without --preset')):
        reproduce.main(['table9', *files, '--preset', 'fast'])
    assert not osp.exists(files[-1])


# -- the fingerprint ------------------------------------------------------
def test_a_run_of_other_options_stops_the_command(
        reproduce, test_configs, tiny_acdc, nvlabs_checkpoint, tmp_path,
        monkeypatch):
    """An interrupted run of rounds=2 where this command runs rounds=1:
    not resumed (it would mix two runs), the work dir and the setting
    named, nothing started; results without a run state are refused too
    (nothing says which run made them)."""
    from mmengine.config import Config

    from mmseg_stag.engine.report import RESULTS_SCHEMA
    from mmseg_stag.engine.run_state import save_run_state
    from mmseg_stag.engine.runs import prepare_config, starting_identity

    def no_run(*args, **kwargs):
        raise AssertionError('a run started')

    monkeypatch.setattr(reproduce.subprocess, 'Popen', no_run)
    work = tmp_path / 'work'
    stem = 'segformer_mit-b5-nvlabs_acdc-continual_source'
    config = str(test_configs / f'{stem}.py')
    cfg = Config.fromfile(config)
    cfg.merge_from_dict(tiny_options(tiny_acdc, rounds=2, head='nvlabs'))
    cfg = prepare_config(cfg, str(work / stem), config)
    (work / stem).mkdir(parents=True)
    save_run_state(str(work / stem / reproduce.STATE_FILE), dict(
        identity=starting_identity(cfg, nvlabs_checkpoint), batches_done=8,
        num_batches=16))
    tent = work / 'segformer_mit-b5-nvlabs_acdc-continual_tent'
    tent.mkdir()
    (tent / reproduce.RESULTS_FILE).write_text(json.dumps(
        dict(schema=RESULTS_SCHEMA)))
    argv = ['table9', '--checkpoint', nvlabs_checkpoint, '--data-root',
            tiny_acdc, '--work-root', str(work), '--only', 'source', 'tent',
            '--cfg-options',
            *as_cli(tiny_options(tiny_acdc, rounds=1, head='nvlabs'))]
    with pytest.raises(SystemExit) as err:
        reproduce.main(argv)
    message = str(err.value)
    assert message.startswith('error: 2 work dir(s) hold another run')
    assert f'{work / stem} holds an interrupted run other than source' in \
        message
    assert 'test_dataloader.dataset.rounds: 2 -> 1' in message
    assert 'the starting weights' not in message  # the same checkpoint
    assert f'{tent}: results (continual_results.json) without a run ' \
        'state' in message
    assert message.count('another --work-root') == 2
    # the same options: it resumes (checked, not run: --dry-run)
    import shutil
    shutil.rmtree(tent)
    argv[argv.index('--cfg-options') + 1:] = as_cli(
        tiny_options(tiny_acdc, rounds=2, head='nvlabs'))
    assert reproduce.main(argv + ['--dry-run']) == 0


# -- the console ----------------------------------------------------------
SAMPLE_LOG = """\
python tools/test.py configs/stag_acdc/x_tent.py ckpt.pth --work-dir w
11/27 10:00:01 - mmengine - INFO - Loaded checkpoint ckpt.pth
11/27 10:00:09 - mmengine - INFO - Iter(test) [  50/1600]    eta: 0:05:10  \
time: 0.2000  data_time: 0.0100  images/s: 4.87  test/loss: 0.6931
11/27 10:00:19 - mmengine - INFO - Iter(test) [ 100/1600]    eta: 0:05:00  \
time: 0.1950  data_time: 0.0100  memory: 12000  images/s: 5.13  \
test/loss: 0.6900
11/27 10:00:29 - mmengine - INFO - Iter(test) [ 1"""


def test_the_progress_line_from_a_run_log(reproduce, tmp_path):
    """Read from MMEngine's test lines as the log grows (a line half
    written waits), then one console line: images, images/s, the run's and
    the table's ETA (later runs at this rate), the log."""
    log = tmp_path / 'run.log'
    head, tail = SAMPLE_LOG.split('11/27 10:00:19')
    log.write_text(head)
    watch = reproduce.LogWatch(str(log))
    assert watch.poll() == reproduce.Progress(50, 1600, 4.87)
    log.write_text(head + '11/27 10:00:19' + tail)
    assert watch.poll() == reproduce.Progress(100, 1600, 5.13)
    assert reproduce.read_progress('no iteration yet\n') is None

    run = reproduce.Run('tent', 'c.py', 'c.py', 'k.pth', 'w', [],
                        images=1600)
    line = reproduce.progress_line(run, watch.last, 5.0, [16000, 0],
                                   str(log), 30)
    assert line == ('[reproduce] tent: 100/1,600 images (6.2%), 5.00 '
                    'images/s, ETA 0:05:00 (table 0:58:20), log '
                    f'{log}')
    # a classification run: batches of 64, the last ones partial
    run = reproduce.Run('tent', 'c.py', 'c.py', 'k.pth', 'w', [],
                        images=750000, batch_size=64)
    line = reproduce.progress_line(run, reproduce.Progress(11730, 11730),
                                   None, [None], str(log), 30)
    assert line.startswith('[reproduce] tent: 750,000/750,000 images '
                           '(100.0%), log ')
    line = reproduce.progress_line(run, reproduce.Progress(10, 11730),
                                   100.0, [None], str(log), 30)
    assert 'runs of unknown size not counted' in line
    assert 'starting (0:00:30, no iteration logged yet)' in \
        reproduce.progress_line(run, None, None, [], str(log), 30)


def test_a_data_root_is_spelled_as_the_config_spells_it(reproduce,
                                                        tmp_path):
    """The same folder as the config's: the config's spelling (a run from
    the docs has that fingerprint); another: absolute."""
    from mmengine.config import Config
    (tmp_path / 'data' / 'acdc').mkdir(parents=True)
    (tmp_path / 'other').mkdir()
    cfg = Config.fromfile(osp.join(REPO, NVLABS_SEG_CFG.format('source')))
    key = 'test_dataloader.dataset.data_root'
    from mmseg_stag.paper.tables import value_at
    assert value_at(cfg, key) == 'data/acdc'
    for given in ('data/acdc/', str(tmp_path / 'data' / 'acdc')):
        assert reproduce.root_option(
            key, cfg, osp.join(tmp_path, given), str(tmp_path)) == \
            f'{key}=data/acdc'
    assert reproduce.root_option(key, cfg, str(tmp_path / 'other'),
                                 str(tmp_path)) == \
        f'{key}={tmp_path / "other"}'


def test_the_images_of_a_run_by_its_config(reproduce):
    """The total the progress and the table's ETA count: the paper's
    stream, or what the config's options make of it."""
    from mmengine.config import Config
    tables = reproduce.find_tables()

    def images(table, method, **options):
        config = next(c for c in tables[table].configs
                      if reproduce.label(c) == method)
        cfg = Config.fromfile(config)
        cfg.merge_from_dict(options)
        return reproduce.planned_images(cfg, tables[table])

    acdc = 'acdc_continual_segformer-b5'
    assert images(acdc, 'tent') == 16000
    assert images(acdc, 'tent', **{
        'test_dataloader.dataset.rounds': 1,
        'test_dataloader.dataset.images_per_condition': 2}) == 8
    assert images('imagenet-c_mild_resnet50-bn', 'tent') == 750000
    assert images('imagenet-c_mixed_vit-b16', 'tent') == 750000
    assert images('cifar10-c_continual_wrn-28-10', 'tent') == 150000


# -- the realistic protocol and the seeds -----------------------------------
STEM = 'segformer_mit-b5-nvlabs_acdc-continual_{}'


def test_realtime_gives_the_runs_and_the_table_their_own_dirs(
        reproduce, files, tmp_path, capsys):
    """``--realtime COST``: tools/test.py --realtime in each command, each
    run in ``<config stem>_realtime-<COST>``, the table apart; so is
    ``measure``; --list says where such runs go."""
    work = tmp_path / 'work'
    assert reproduce.main(['table9', *files, '--dry-run', '--only', 'tent',
                           'tent-stag', '--realtime', '2.5']) == 0
    out = capsys.readouterr().out
    for method in ('tent', 'tent-stag'):
        stem = STEM.format(method)
        assert f'{stem}.py {tmp_path / "model.pth"} --work-dir ' \
            f'{work / stem}_realtime-2.5 --realtime 2.5 --cfg-options ' in out
        assert f'{method}: runs, 16,000 images ({work / stem}' \
            '_realtime-2.5)' in out
    assert 'protocol: realistic (--realtime 2.5' in out
    assert f'--out {work}/tables/table9_realtime-2.5_only-tent+tent-stag\n' \
        in out
    assert reproduce.main(['table9', *files, '--dry-run', '--only', 'tent',
                           '--realtime', 'measure']) == 0
    out = capsys.readouterr().out
    assert f'--work-dir {work / STEM.format("tent")}_realtime-measure ' \
        '--realtime measure --cfg-options' in out
    assert f'--out {work}/tables/table9_realtime-measure_only-tent\n' in out
    # a whole number: the same cost as tools/test.py reads it
    assert reproduce.main(['table9', *files, '--dry-run', '--only', 'tent',
                           '--realtime', '3']) == 0
    assert f'{STEM.format("tent")}_realtime-3 --realtime 3 ' in \
        capsys.readouterr().out
    assert reproduce.main(['--list', '--realtime', '2.5', '--seeds', '3']) \
        == 0
    out = capsys.readouterr().out
    assert out.startswith('with these options each run goes to WORK_ROOT/'
                          '<config stem>_realtime-2.5[_seed<k>]')
    assert 'WORK_ROOT/tables/<table>[_<preset>]_realtime-2.5_seeds3' in out
    assert not work.exists()


def test_realtime_measure_is_refused_with_a_cuda_graph(reproduce, files):
    """As the online loop refuses it, before any run: the fast preset's
    graphed configs time no eager step."""
    with pytest.raises(SystemExit, match=re.escape(
            'error: --realtime measure: configs/stag_acdc/segformer_mit-b5-'
            'nvlabs_acdc-continual_tent-stag_bf16-graph.py: test_cfg.'
            "realtime.cost='measure' times eager steps")):
        reproduce.main(['table9', *files, '--dry-run', '--preset', 'fast',
                        '--only', 'source', 'tent-stag', '--realtime',
                        'measure'])


def test_an_offline_run_is_not_a_realistic_one(reproduce, files, tmp_path,
                                               monkeypatch, capsys):
    """A finished offline run in ``<config stem>`` is skipped offline and
    left alone by ``--realtime`` (its runs have their own work dirs)."""
    work = tmp_path / 'work'
    done = str(work / STEM.format('tent'))
    monkeypatch.setattr(reproduce, 'on_disk', lambda d: reproduce.OnDisk(
        'finished' if d == done else 'new'))
    monkeypatch.setattr(reproduce, 'check_fingerprints', lambda runs: None)
    assert reproduce.main(['table9', *files, '--dry-run', '--only',
                           'tent']) == 0
    assert 'tent: finished: skipped' in capsys.readouterr().out
    assert reproduce.main(['table9', *files, '--dry-run', '--only', 'tent',
                           '--realtime', '2']) == 0
    out = capsys.readouterr().out
    assert f'tent: runs, 16,000 images ({done}_realtime-2)' in out
    assert f'--work-dir {done}_realtime-2 --realtime 2 ' in out


def test_seeds_run_each_config_at_each_seed(reproduce, files, tmp_path,
                                            capsys):
    """``--seeds 3``: seeds 0, 1, 2 (the config's own first: its run is the
    one made without --seed, in ``<config stem>``), the others in
    ``_seed<k>``, seed after seed; all collected into one table."""
    work = tmp_path / 'work'
    assert reproduce.main(['table9', *files, '--dry-run', '--only', 'tent',
                           'tent-stag', '--seeds', '3']) == 0
    out = capsys.readouterr().out
    dirs = {(m, k): work / (STEM.format(m) + ('' if k == 0 else
                                             f'_seed{k}'))
            for m in ('tent', 'tent-stag') for k in range(3)}
    commands = [line for line in out.splitlines()
                if line.startswith('[reproduce] tent')]
    assert len(commands) == 6
    for line, (k, method) in zip(commands, [(k, m) for k in range(3)
                                            for m in ('tent', 'tent-stag')]):
        assert line.startswith(f'[reproduce] {method} seed {k} (run ')
        assert f'--work-dir {dirs[(method, k)]} --seed {k} --cfg-options' \
            in line
    assert 'seeds: 3 of each config' in out
    collect = next(line for line in out.splitlines()
                   if 'collect_results.py' in line)
    assert collect.split(' --out ')[0].split()[3:] == [
        str(dirs[(m, k)]) for k in range(3) for m in ('tent', 'tent-stag')]
    assert collect.endswith(f'--out {work}/tables/table9_seeds3_'
                            'only-tent+tent-stag')
    # from --seed: each a seed other than the config's own
    assert reproduce.main(['table9', *files, '--dry-run', '--only', 'tent',
                           '--seed', '5', '--seeds', '2',
                           '--realtime', '2']) == 0
    out = capsys.readouterr().out
    for k in (5, 6):
        assert f'--work-dir {work / STEM.format("tent")}_realtime-2_seed' \
            f'{k} --seed {k} --realtime 2 --cfg-options' in out
    assert f'--out {work}/tables/table9_realtime-2_seed5_seeds2_only-tent' \
        in out
    # a classification config's own seed is 1: seeds 1 and 2
    assert reproduce.main(['cifar10-c_continual_wrn-28-10', *files,
                           '--dry-run', '--only', 'tent', '--seeds',
                           '2']) == 0
    out = capsys.readouterr().out
    stem = 'cifar10-c_continual_wrn-28-10_tent'
    assert f'--work-dir {work / stem} --seed 1 ' in out
    assert f'--work-dir {work / stem}_seed2 --seed 2 ' in out


@pytest.mark.parametrize('argv, message', [
    (['--seeds', '0'], '--seeds 0: a number of seeds, 1 or more'),
    (['--seeds', '-2'], '--seeds -2: a number of seeds, 1 or more'),
    (['--seeds', 'three'], "--seeds: invalid int value: 'three'"),
    (['--seeds', '2.5'], "--seeds: invalid int value: '2.5'"),
    (['--seed', '-1'], '--seed -1: a seed from 0 to 4294967295'),
    (['--seeds', '2', '--cfg-options', 'randomness.seed=3'],
     '--cfg-options randomness.seed with --seed/--seeds: give the seed once'),
    (['--cfg-options', 'test_cfg.realtime.cost=2'],
     '--cfg-options test_cfg.realtime...: give --realtime COST'),
    (['--realtime', '0'], "--realtime: '0': a step's cost in forwards"),
    (['--realtime', 'fast'], "--realtime: 'fast': a step's cost in "
     'forwards, a number > 0, or measure'),
])
def test_bad_seeds_and_costs_are_refused(reproduce, files, argv, message,
                                         capsys):
    with pytest.raises(SystemExit) as err:
        reproduce.main(['table9', *files, '--dry-run', *argv])
    assert err.value.code == 2
    assert message in capsys.readouterr().err
    assert not osp.exists(files[-1])


def test_ray_trials_get_the_seed_and_the_protocol(
        reproduce, files, tmp_path, monkeypatch, capsys):
    """The sweep's trial passes a run's seed as --seed and its protocol as
    the setting --realtime makes (test_cfg.realtime.cost, a float: the
    same fingerprint)."""
    monkeypatch.setattr(reproduce, 'check_fingerprints', lambda runs: None)
    sweep = reproduce.load_sweep()
    handed = {}
    monkeypatch.setattr(sweep, 'run_on_ray',
                        lambda runs, args: handed.update(runs=runs))
    monkeypatch.setattr(reproduce, 'load_sweep', lambda: sweep)
    reproduce.main(['table9', *files, '--launcher', 'ray', '--only', 'tent',
                    '--seeds', '2', '--realtime', '3'])
    stem = STEM.format('tent')
    assert [(r['name'], r['seed'], r['options']) for r in handed['runs']] \
        == [(f'{stem}_realtime-3', 0, ['test_cfg.realtime.cost=3.0']),
            (f'{stem}_realtime-3_seed1', 1, ['test_cfg.realtime.cost=3.0'])]
    capsys.readouterr()


def test_the_fingerprint_holds_the_protocol_and_the_seed(
        reproduce, test_configs, tiny_acdc, nvlabs_checkpoint, tmp_path,
        monkeypatch):
    """A realistic work dir holding a run of another cost, or an offline
    run, is neither skipped nor resumed, and a seed's work dir holding
    another seed's run neither; a run state of the same protocol and seed
    resumes."""
    from mmengine.config import Config

    from mmseg_stag.engine.run_state import save_run_state
    from mmseg_stag.engine.runs import prepare_config, starting_identity

    def no_run(*args, **kwargs):
        raise AssertionError('a run started')

    monkeypatch.setattr(reproduce.subprocess, 'Popen', no_run)
    work = tmp_path / 'work'
    stem = STEM.format('source')
    config = str(test_configs / f'{stem}.py')

    def state(folder, **prepared):
        cfg = Config.fromfile(config)
        cfg.merge_from_dict(tiny_options(tiny_acdc, rounds=1, head='nvlabs'))
        cfg = prepare_config(cfg, str(work / folder), config, **prepared)
        (work / folder).mkdir(parents=True, exist_ok=True)
        save_run_state(str(work / folder / reproduce.STATE_FILE), dict(
            identity=starting_identity(cfg, nvlabs_checkpoint),
            batches_done=4, num_batches=8))

    state(f'{stem}_realtime-2.5', realtime=3.0)
    state(f'{stem}_realtime-2.5_seed1', seed=1)  # offline
    argv = ['table9', '--checkpoint', nvlabs_checkpoint, '--data-root',
            tiny_acdc, '--work-root', str(work), '--only', 'source',
            '--realtime', '2.5', '--seeds', '2', '--dry-run', '--cfg-options',
            *as_cli(tiny_options(tiny_acdc, rounds=1, head='nvlabs'))]
    with pytest.raises(SystemExit) as err:
        reproduce.main(argv)
    message = str(err.value)
    assert message.startswith('error: 2 work dir(s) hold another run')
    assert f'{work / stem}_realtime-2.5 holds an interrupted run other ' \
        'than source seed 0' in message
    assert 'test_cfg.realtime.cost: 3.0 -> 2.5' in message
    assert 'test_cfg.realtime.cost: <absent> -> 2.5' in message
    assert 'randomness.seed' not in message
    # the same protocol, another seed
    state(f'{stem}_realtime-2.5', realtime=2.5)
    state(f'{stem}_realtime-2.5_seed1', realtime=2.5)  # seed 0
    with pytest.raises(SystemExit) as err:
        reproduce.main(argv)
    message = str(err.value)
    assert message.startswith('error: 1 work dir(s) hold another run')
    assert f'{work / stem}_realtime-2.5_seed1 holds' in message
    assert 'randomness.seed: 0 -> 1' in message
    # both the planned runs: resumed, each with its seed and protocol
    state(f'{stem}_realtime-2.5_seed1', realtime=2.5, seed=1)
    assert reproduce.main(argv) == 0


def test_two_realistic_seeds_run_skipped_and_collected(
        reproduce, test_configs, tiny_acdc, nvlabs_checkpoint, tmp_path,
        capsys):
    """TENT at two seeds under the realistic protocol, end to end: the runs
    record the protocol, a second call skips both (their fingerprints are
    the planned ones), the realistic table holds their mean ± std."""
    import statistics
    work = tmp_path / 'work'
    argv = ['table9', '--checkpoint', nvlabs_checkpoint, '--data-root',
            tiny_acdc, '--work-root', str(work), '--only', 'tent',
            '--allow-short', '--realtime', '2', '--seeds', '2',
            '--cfg-options',
            *as_cli(tiny_options(tiny_acdc, rounds=1, head='nvlabs'))]
    assert reproduce.main(argv) == 0
    out = capsys.readouterr().out
    assert 'all 2 runs finished' in out
    table = work / 'tables' / 'table9_realtime-2_seeds2_only-tent'
    assert f'the table: {table}/paper_table_realtime.md' in out
    scores = []
    for k, suffix in enumerate(('', '_seed1')):
        with open(work / (STEM.format('tent') + '_realtime-2' + suffix) /
                  'continual_results.json') as f:
            record = json.load(f)
        # 2 images a stage, batch 1: the 1st of each stage adapts
        assert (record['realtime']['cost'], record['realtime']['how'],
                record['realtime']['batches_adapted'],
                record['realtime']['batches_predicted_only'],
                record['provenance']['seed']) == (2.0, 'given', 4, 4, k)
        scores.append(record['mean_over_stages'])
    with open(table / 'paper_table_realtime.json') as f:
        [row] = json.load(f)['rows']
    assert row['base_ours'] == round(statistics.fmean(scores), 2)
    assert row['base_ours_std'] == round(statistics.stdev(scores), 2)
    assert row['base_seeds'] == [0, 1]
    assert not (table / 'paper_table.md').exists()
    assert reproduce.main(argv) == 0
    out = capsys.readouterr().out
    assert 'tent seed 0: finished: skipped' in out and \
        'tent seed 1: finished: skipped' in out
    assert 'tools/test.py' not in out
