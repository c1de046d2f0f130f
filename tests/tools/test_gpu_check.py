"""tools/gpu_check.py without a GPU: it says so and exits non-zero before
running anything; its development mode (``--allow-cpu --quick``) runs the
whole pipeline on the CPU with tiny sizes and writes the one report
(Markdown + JSON) with every step and figure; the tests step's summary
and the precision switch on their own. No timing is asserted."""
import json
import os
import os.path as osp
import sys
import time
from types import SimpleNamespace

import pytest
import tool_runs
import torch

from benchmarks import gpu_report, gpu_steps

REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))


def run_gpu_check(*args):
    """The tool in a process of its own with CUDA hidden (the CPU path on
    any machine)."""
    env = dict(os.environ, CUDA_VISIBLE_DEVICES='', OMP_NUM_THREADS='1')
    return tool_runs.run(
        [sys.executable, osp.join(REPO, 'tools/gpu_check.py'), *args],
        capture_output=True, text=True, cwd=REPO, env=env, timeout=600)


@pytest.fixture
def gpu_check(load_tool):
    """The command tools/gpu_check.py, loaded by its path."""
    return load_tool('gpu_check')


def test_without_cuda_it_says_so_and_runs_nothing(tmp_path):
    out = tmp_path / 'report'
    proc = run_gpu_check('--out-dir', str(out))
    assert proc.returncode == 2
    assert 'no GPU' in proc.stderr and 'Nothing was run' in proc.stderr
    assert not out.exists()


def test_quick_cpu_run_writes_the_report(tmp_path, gpu_check):
    out = tmp_path / 'report'
    # the graph rows need CUDA: said and left out
    # the loop: a run with its own image count, a preset left out without
    # CUDA (said)
    proc = run_gpu_check('--allow-cpu', '--quick', '--out-dir', str(out),
                         '--seg-methods', 'tent', 'cotta_fast',
                         'cotta_graph', 'hybrid_tta', '--loop-methods',
                         'tent:4', 'tent-stag', 'tent-stag_bf16-graph')
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert 'all ok' in proc.stdout
    assert 'cotta_graph (CUDA graphs) need a CUDA device' in proc.stdout
    assert 'loop tent-stag_bf16-graph: a fast preset needs a CUDA device' \
        in proc.stdout
    report = json.loads((out / 'gpu_check.json').read_text())
    env = report['environment']
    assert env['device'] == 'cpu' and env['torch'] == torch.__version__
    assert env['date'] and report['quick'] is True
    steps = {s['name']: s for s in report['steps']}
    assert list(steps) == list(gpu_check.STEPS)
    assert all(s['status'] == 'ok' and s['seconds'] >= 0
               for s in steps.values())
    assert report['total_minutes'] > 0 and report['budget_minutes'] == 9
    assert report['finished'] is True

    tests = steps['tests']['result']
    assert tests['passed_all'] and tests['failed'] == tests['errors'] == 0
    # CUDA hidden: the cuda tests are collected and skipped, saying why
    assert tests['skipped'] > 0 and tests['passed'] == 0
    assert set(tests['skip_reasons']) == {'no CUDA device'}
    assert osp.isfile(tests['log']) and osp.isfile(tests['junit'])

    rows = steps['step_cost']['result']['rows']
    # the SegFormer's three baselines with MMSeg's attention and SDPA, then
    # the ResNet's TENT
    assert [(r['method'], r['mit']) for r in rows] == [
        ('tent', 'mmseg'), ('cotta_fast', 'mmseg'), ('tent', 'sdpa-views'),
        ('cotta_fast', 'sdpa-views'), ('hybrid_tta', 'mmseg'),
        ('hybrid_tta', 'sdpa-views'), ('tent', None)]
    assert {r['precision'] for r in rows} == {'fp32'}
    assert 'MiT sdpa-views' in rows[2]['model']
    assert rows[4]['settings'].startswith('batch 1, 128x64')
    for row in rows:
        assert set(row['arms']) == {row['method'], row['method'] + '+stag'}
        for arm in row['arms'].values():
            assert arm['step_ms'] > 0 and arm['images_per_s'] > 0
            assert arm['peak_rss_mb'] > 0
        # STAG's share: the paired whole steps' ratio, no term alone
        assert row['stag_pair_ratio']['median'] > 0
        assert not any(key.startswith('stag_term') for key in row)
        for key in ('stag_time_share_pct', 'stag_memory_share_pct'):
            assert isinstance(row[key], float), key
        assert row['settings'] and row['batch'] in (1, 2)

    loader = steps['loader']['result']
    assert [r['workers'] for r in loader['rows']] == [1, 2]
    assert all(r['images'] == 8 and r['images_per_s'] > 0
               for r in loader['rows'])

    loop = steps['loop']['result']['methods']
    assert list(loop) == ['tent', 'tent-stag', 'tent-stag_bf16-graph']
    assert loop.pop('tent-stag_bf16-graph') == dict(
        status='skipped', images_asked=3, reason='a fast preset: needs CUDA')
    assert {m: (r['status'], r['images']) for m, r in loop.items()} == {
        'tent': ('ok', 4), 'tent-stag': ('ok', 3)}
    for row in loop.values():
        assert row['classifier_calls_per_image'] == 1
        assert row['whole_images_per_second'] > 0 and row['seconds'] > 0
        # the stream: 2 images per condition; each stage's score read
        # from the run's continual_results.json
        assert [(s['condition'], s['num_images']) for s in row['stages']] \
            == [('fog', 2), ('night', row['images'] - 2)]
        assert all(0 <= s['score'] <= 100 for s in row['stages'])
    assert steps['loop']['result']['pairs'] == []

    profile = steps['profile']['result']
    for part in ('step', 'step_fused', 'loop'):
        assert profile[part]['wall_ms'] > 0
        assert profile[part]['cuda_kernel_ms'] is None  # no CUDA here
        assert profile[part]['scalar_reads'] >= 0
    # on the CPU every read is a host read; the fused Adam reads no step
    # count, the config's reads one per norm tensor at least
    assert profile['step_fused']['optimizer']['fused'] is True
    assert 'device_read' not in profile['step']['transfers']
    assert profile['step']['transfers'].get('host_read', 0) > \
        profile['step_fused']['transfers'].get('host_read', 0)
    assert profile['loop']['loader_wait_wall_ms'] >= 0

    text = (out / 'gpu_check.md').read_text()
    for heading in ('# GPU check', '## Steps', '## CUDA tests',
                    '## Step cost: each baseline vs +STAG', '## Loader',
                    '## Whole loop', '## Profile (torch.profiler)'):
        assert heading in text, heading
    assert 'not a measurement' in text
    assert 'images/s' in text and 'peak allocated (MB)' in text
    assert '| tent-stag_bf16-graph | skipped: a fast preset: needs CUDA |' \
        in text
    assert 'STAG term alone' not in text


def run_suite(tmp_path, source, **args):
    """The context of ``gpu_steps.run_tests`` on a suite of one file
    ``source``, and what the step saves as it goes."""
    tests = tmp_path / 'suite' / 'test_suite.py'
    tests.parent.mkdir()
    # the project's pytest.ini has -q, which -v alone cancels
    (tests.parent / 'pytest.ini').write_text('[pytest]\naddopts = -q\n')
    tests.write_text(source)
    saved = []
    ctx = SimpleNamespace(
        args=SimpleNamespace(out_dir=str(tmp_path / 'out'),
                             test_paths=[str(tests.parent)], budget=9,
                             **args),
        repo=REPO, save_partial=saved.append)
    return ctx, saved


def test_tests_summary(tmp_path, gpu_check):
    """A finished run counted as JUnit XML counts it, from the outcomes
    the plugin streamed: properties, failures and errors with their
    messages, skip and xfail reasons, a module skipped at collection."""
    ctx, _ = run_suite(
        tmp_path, 'import pytest\n\n\n@pytest.fixture\ndef broken():\n'
        '    raise RuntimeError("no device")\n\n\n@pytest.mark.cuda\n'
        'def test_ok(record_property):\n    record_property("fp16", 1)\n'
        '\n\n@pytest.mark.cuda\ndef test_bad():\n    assert 1 == 2\n\n\n'
        '@pytest.mark.cuda\n@pytest.mark.skip(reason="no CUDA device")\n'
        'def test_off():\n    pass\n\n\n@pytest.mark.cuda\n'
        '@pytest.mark.xfail(reason="known")\ndef test_known():\n'
        '    assert False\n\n\n@pytest.mark.cuda\n'
        'def test_err(broken):\n    pass\n', tests_timeout=120,
        test_workers=1)
    (tmp_path / 'suite' / 'test_skipped.py').write_text(
        'import pytest\n\npytest.importorskip("not_a_module_here")\n')
    res = gpu_steps.run_tests(ctx)
    assert res['returncode'] == 1 and not res['passed_all']
    assert (res['passed'], res['failed'], res['errors'], res['skipped']) \
        == (1, 1, 1, 3)
    assert res['skip_reasons'] == {'collection skipped': 1,
                                   'no CUDA device': 1, 'known': 1}
    assert res['properties'] == [dict(
        test='test_suite.py::test_ok', name='fp16', value='1')]
    assert [(f['test'], f['kind']) for f in res['failures']] == [
        ('test_suite.py::test_bad', 'failure'),
        ('test_suite.py::test_err', 'error')]
    assert 'assert 1 == 2' in res['failures'][0]['message']
    assert res['failures'][1]['message'].startswith(
        'failed on setup with "RuntimeError: no device')
    assert 'running_at_limit' not in res


def test_tests_past_their_limit_fail_with_what_ran(tmp_path, gpu_check):
    """A stopped test run: the step fails naming its limit, and the tests
    that had finished are counted from the streamed outcomes."""
    ctx, saved = run_suite(
        tmp_path, 'import time\nimport pytest\n\n\n@pytest.mark.cuda\n'
        'def test_a():\n    time.sleep(1.5)\n\n\n@pytest.mark.cuda\n'
        'def test_b():\n    assert False\n\n\n@pytest.mark.cuda\n'
        'def test_c():\n    time.sleep(120)\n', tests_timeout=30,
        test_workers=2)
    # 30 s: 3 processes each import mmseg_stag (the streaming plugin's
    # package, ~3 s of CPU) before test_a's 1.5 s; 12 s was too few on 2
    # cores busy with the rest of the suite
    with pytest.raises(TimeoutError, match='past their 30 s'):
        gpu_steps.run_tests(ctx)
    res = saved[-1]
    assert res['returncode'] is None and not res['passed_all']
    assert (res['passed'], res['failed']) == (1, 1)
    assert res['failures'][0]['test'].endswith('test_suite.py::test_b')
    # its traceback kept though pytest never reached the session's end
    assert 'assert False' in res['failures'][0]['message']
    assert osp.isfile(res['failure_reports'])
    # each finished test's time kept too, and the one stopped is named
    assert sorted(t['test'].rsplit('::', 1)[1] for t in res['slowest']) \
        == ['test_a', 'test_b']
    assert all(t['seconds'] >= 0 for t in res['slowest'])
    assert [t.rsplit('::', 1)[1] for t in res['running_at_limit']] == [
        'test_c']
    text = '\n'.join(gpu_report.md_tests(res))
    assert 'stopped at its time limit' in text
    assert 'still running at the limit: `' in text
    # the report names the tests of a second or more
    assert 'slowest' in text and 'test_a` 1.' in text \
        and 'test_b` ' not in text
    assert 'test_b`: assert False' in text


def test_test_workers_follow_pytest_xdist(monkeypatch, capsys):
    """8 processes where pytest-xdist imports; without it one, said, and
    more than one asked for is refused naming the option."""
    assert gpu_steps.test_workers(None) == gpu_steps.TEST_WORKERS == 8
    assert gpu_steps.test_workers(3) == 3
    find_spec = gpu_steps.importlib.util.find_spec
    monkeypatch.setattr(gpu_steps.importlib.util, 'find_spec',
                        lambda name: None if name == 'xdist'
                        else find_spec(name))
    assert gpu_steps.test_workers(None) == 1
    assert 'pytest-xdist does not import' in capsys.readouterr().out
    assert gpu_steps.test_workers(1) == 1
    with pytest.raises(RuntimeError, match='--test-workers 4 needs'):
        gpu_steps.test_workers(4)


@pytest.mark.parametrize('name,tf32,dtype', [
    ('fp32', False, None), ('tf32', True, None),
    ('bf16', False, torch.bfloat16)])
def test_precision_switches_and_restores(name, tf32, dtype, gpu_check):
    """TF32 flags and the task adapter's forward-only autocast inside the
    block, the previous settings after it."""
    task = SimpleNamespace(task_adapter=SimpleNamespace(autocast_dtype=None))
    flags = (torch.backends.cuda.matmul.allow_tf32,
             torch.backends.cudnn.allow_tf32)
    with gpu_steps.precision(task, name):
        assert torch.backends.cuda.matmul.allow_tf32 is tf32
        assert torch.backends.cudnn.allow_tf32 is tf32
        assert task.task_adapter.autocast_dtype is dtype
    assert (torch.backends.cuda.matmul.allow_tf32,
            torch.backends.cudnn.allow_tf32) == flags
    assert task.task_adapter.autocast_dtype is None


def test_partial_report_of_a_stopped_run(tmp_path, gpu_check):
    """A run stopped in its second step: the report written after the
    first step and during the second says what was measured and that the
    run had not finished."""
    args = gpu_check.parse_args(['--allow-cpu', '--quick', '--out-dir',
                                 str(tmp_path)])
    report = dict(_t0=0.0, command='c', quick=True, budget_minutes=1.0,
                  finished=False, steps=[], environment=dict(
                      date='d', gpu=None, torch='t', cuda_runtime=None,
                      cudnn=None, mmengine='m', mmcv='m',
                      mmsegmentation='m', cpus=2))
    ctx = SimpleNamespace(args=args)
    gpu_check.run_step('loader', lambda c: dict(
        images=dict(count=1, size=(4, 2), format='PNG', mean_mb=0.1),
        pipeline='p', rows=[]), ctx, report)

    class Stopped(BaseException):  # as a time limit's signal would
        pass

    def stopped(c):
        c.save_partial(dict(rows=[]))
        raise Stopped

    with pytest.raises(Stopped):
        gpu_check.run_step('step_cost', stopped, ctx, report)
    saved = json.loads((tmp_path / 'gpu_check.json').read_text())
    assert [(s['name'], s['status']) for s in saved['steps']] == [
        ('loader', 'ok'), ('step_cost', 'running')]
    assert saved['finished'] is False
    text = (tmp_path / 'gpu_check.md').read_text()
    assert 'had not finished' in text and '## Loader' in text


def test_budget_picks_the_pairs(gpu_check):
    """Each step-cost row gets its share of the budget left after the
    fixed steps; explicit counts stay as given."""
    args = gpu_check.parse_args(['--budget', '10', '--only', 'step_cost',
                                 '--precisions', 'fp32', 'bf16'])
    ctx = SimpleNamespace(args=args, t0=time.perf_counter(),
                          cuda=True)
    plan = gpu_steps.step_cost_plan(ctx)
    # B5 TENT, TENT as CUDA graphs, CoTTA with its device options as CUDA
    # graphs and Hybrid-TTA on one MiT, ResNet TENT eager and graphed:
    # x 2 precisions
    rows = 2 * (4 + 2)
    assert gpu_steps.pair_seconds(ctx, plan) == pytest.approx(
        gpu_steps.PAIRS_SHARE * (600 - rows * gpu_steps.ROW_OVERHEAD_S)
        / rows, rel=1e-3)
    # no CUDA (--allow-cpu): no graphs
    ctx.cuda = False
    assert [kinds for _, kinds, _ in gpu_steps.step_cost_plan(ctx)] == [
        ['tent'], ['hybrid_tta'], ['tent']]
    # --skip-resnet: the SegFormer rows alone (a targeted rerun)
    args.skip_resnet = True
    assert [kinds for _, kinds, _ in gpu_steps.step_cost_plan(ctx)] == [
        ['tent'], ['hybrid_tta']]
    args.skip_resnet = False
    assert args.pairs is None and args.tests_timeout is None
    fixed = gpu_check.parse_args(['--pairs', '7', '--method-pairs', '3'])
    assert (fixed.pairs, fixed.method_pairs) == (7, 3)


def test_bad_counts_are_refused(capsys, gpu_check):
    with pytest.raises(SystemExit):
        gpu_check.parse_args(['--pairs', '0'])
    assert '--pairs must be >= 1' in capsys.readouterr().err
    with pytest.raises(SystemExit):
        gpu_check.parse_args(['--loop-images', '4', '--loop-warmup', '4'])
    for bad, message in ((['--budget', '0'], '--budget must be > 0'),
                         (['--min-pairs', '9', '--max-pairs', '3'],
                          '--min-pairs <= --max-pairs')):
        with pytest.raises(SystemExit):
            gpu_check.parse_args(bad)
        assert message in capsys.readouterr().err
    # the STAG options retired from the package are no options here
    for retired in ('--stag-compile', '--stag-triton', '--term-repeats',
                    '--stag-norm-tap', '--extra-stag-arms'):
        with pytest.raises(SystemExit):
            gpu_check.parse_args([retired, '1'])
        assert 'unrecognized arguments' in capsys.readouterr().err


def test_the_targets_held_against_the_fifth_h100_run():
    """The report's verdicts on the fifth H100 run's own figures
    (docs/results/gpu/2026-11-27-h100-e): those its notes give by hand."""
    from benchmarks.gpu_report import target_verdicts
    with open(osp.join(REPO, 'docs/results/gpu/2026-11-27-h100-e/'
                       'full_run.json')) as f:
        report = json.load(f)
    met = {(v['target'].split(' (')[0], v['where']):
           [label for label, _, ok in v['figures'] if ok]
           for v in target_verdicts(report)}
    b5 = 'SegFormer-B5 NVlabs head, MiT sdpa-views'
    assert met['STAG <= 0.3 % of the B5 TENT step',
               f'{b5}, tent_graph, bf16, 51 pairs'] == []
    assert met['STAG <= 0.5 % of the ResNet-50 fp32 step',
               'ResNet-50 (ImageNet-C), tent, fp32, 27 pairs'] == ['tent+stag']
    assert met['TENT+STAG on the B5 <= 40 ms in bf16',
               f'{b5}, tent_graph, bf16'] == ['tent_graph+stag']
    assert met['TENT+STAG on the B5 <= 40 ms in bf16',
               f'{b5}, tent, bf16'] == []
    assert met['CoTTA <= 0.45 s an image with its device options',
               f'{b5}, cotta_graph, bf16'] == ['cotta_graph',
                                               'cotta_graph+stag']
    assert not any(k[0].startswith('STAG term') for k in met)
    assert met['No call that waits for the GPU inside a TENT+STAG step',
               'SegFormer-B5 NVlabs head, the step alone'] == [
        "the config's Adam", 'fused Adam']
    # eager B5 steps are not held against the 0.3 % (their spread)
    assert not any(k[1].startswith(f'{b5}, tent, ') for k in met
                   if k[0].startswith('STAG <= 0.3 %'))


# ----------------------------------------------------------- the loop step
def test_loop_methods_are_parsed_and_checked(capsys, gpu_check):
    """--loop-methods NAME[:IMAGES]: each config checked before any work,
    each count its own, the generated stream large enough for the
    largest (else refused naming both options)."""
    args = gpu_check.parse_args([
        '--only', 'loop', '--images-per-condition', '100', '--loop-methods',
        'tent-stag_bf16-graph:400', 'tent-stag:400', 'cotta:40',
        'cotta_bf16-graph:40', 'tent'])
    assert args.loop_methods == [
        ('tent-stag_bf16-graph', 400), ('tent-stag', 400), ('cotta', 40),
        ('cotta_bf16-graph', 40), ('tent', None)]
    ctx = SimpleNamespace(args=args, cuda=True)
    assert gpu_steps.loop_plan(ctx)[-1] == ('tent', 48)  # --loop-images
    # the default: today's runs, the preset on CUDA only
    ctx.args = gpu_check.parse_args([])
    assert ctx.args.loop_methods is None
    assert [m for m, _ in gpu_steps.loop_plan(ctx)] == [
        'tent', 'tent-stag', 'tent-stag_bf16-graph']
    ctx.cuda = False
    assert gpu_steps.loop_plan(ctx) == [('tent', 48), ('tent-stag', 48)]
    for bad, message in (
            (['tent', 'tnet:40'], "--loop-methods 'tnet:40': no config "
             'configs/stag_acdc/segformer_mit-b5-nvlabs_acdc-continual_'
             'tnet.py'),
            (['tent_bf16'], 'continual_tent_bf16.py'),
            (['tent:x'], 'not NAME or NAME:IMAGES'),
            (['tent', 'tent:9'], "names 'tent' twice"),
            (['tent:8'], '--loop-methods tent:8: need more images than '
             '--loop-warmup 8'),
            (['tent', 'cotta:65'], '--loop-methods cotta:65 needs 65 '
             'images; the generated stream holds 64 (--images-per-condition'
             ' 16 x 4 conditions): pass --images-per-condition 17 or more')):
        with pytest.raises(SystemExit):
            gpu_check.parse_args(['--loop-methods', *bad])
        assert message in capsys.readouterr().err, bad
    with pytest.raises(SystemExit):
        gpu_check.parse_args(['--loop-images', '100'])
    assert '--loop-images 100 needs 100 images' in capsys.readouterr().err
    # the stream's size matters to the loop step only
    assert gpu_check.parse_args(['--only', 'loader', '--loop-methods',
                                 'tent:400']).loop_methods == [('tent', 400)]


def loop_row(images, rate, peak, scores, **extra):
    return dict(status='ok', images_asked=images, images=images,
                images_per_second=rate, whole_images_per_second=rate / 2,
                seconds=images / rate, classifier_calls_per_image=1.0,
                peak_allocated_mb=peak, mIoU=sum(scores) / len(scores),
                stages=[dict(stage=k, round=1, condition=c, score=v,
                             num_images=images // len(scores))
                        for k, (c, v) in enumerate(zip(
                            ('fog', 'night', 'rain', 'snow'), scores), 1)],
                **extra)


def test_presets_are_paired_with_their_faithful_configs():
    """Each preset that ran beside its faithful config on the same images:
    the speed-up, both peaks, the stage scores' largest absolute and mean
    difference; a preset on other images is named, not compared; one
    without its faithful run, or failed, is not paired."""
    methods = {
        'tent-stag_bf16-graph': loop_row(400, 20.0, 3000.0,
                                         [10.0, 20.5, 30.0, 40.0]),
        'tent-stag': loop_row(400, 5.0, 5000.0, [10.5, 20.0, 29.0, 40.0]),
        'tent_bf16-graph': loop_row(40, 10.0, 2900.0, [10.0]),
        'tent': loop_row(400, 5.0, 4900.0, [1.0, 2.0, 3.0, 4.0]),
        'cotta_bf16-graph': dict(status='failed', images_asked=40,
                                 error='RuntimeError: capture'),
        'cotta': loop_row(40, 0.5, 12000.0, [11.0]),
        'cotta-stag_bf16-graph': loop_row(40, 2.0, 13000.0, [11.0]),
        'source_bf16': loop_row(40, 30.0, 2000.0, [float('nan')]),
        'source': loop_row(40, 10.0, 2500.0, [5.0]),
    }
    assert gpu_steps.faithful_of('tent-stag_bf16-graph') == 'tent-stag'
    assert gpu_steps.faithful_of('source_bf16') == 'source'
    assert gpu_steps.faithful_of('tent-stag') is None
    pairs = {p['preset']: p for p in gpu_steps.pair_presets(methods)}
    assert set(pairs) == {'tent-stag_bf16-graph', 'tent_bf16-graph',
                          'source_bf16'}
    p = pairs['tent-stag_bf16-graph']
    assert (p['faithful'], p['images'], p['same_images']) == \
        ('tent-stag', 400, True)
    assert p['speedup'] == pytest.approx(4.0)
    assert p['whole_speedup'] == pytest.approx(4.0)
    assert p['peak_allocated_mb'] == dict(preset=3000.0, faithful=5000.0)
    assert [d['delta'] for d in p['stages']] == pytest.approx(
        [-0.5, 0.5, 1.0, 0.0])
    assert p['max_abs_delta'] == pytest.approx(1.0)
    assert p['mean_delta'] == pytest.approx(0.25)
    assert pairs['tent_bf16-graph']['same_images'] is False
    assert 'not on the same images (40 vs 400)' in \
        pairs['tent_bf16-graph']['note']
    assert 'speedup' not in pairs['tent_bf16-graph']
    # a NaN stage score is left out of the comparison
    assert pairs['source_bf16']['stages'] == []
    assert pairs['source_bf16']['max_abs_delta'] is None

    result = dict(methods=methods, images=48, warmup=8,
                  pairs=gpu_steps.pair_presets(methods), settings='s',
                  generate_seconds=12.5)
    text = '\n'.join(gpu_report.md_loop(result))
    assert '### Fast preset vs faithful config' in text
    assert ('| tent-stag_bf16-graph | tent-stag | 400 | 4.00 | 4.00 | '
            '3,000.0 | 5,000.0 | 4 | 1.00 | +0.25 |') in text
    assert '| tent_bf16-graph | tent | 40 | not on the same images' in text
    assert '| cotta_bf16-graph | failed: RuntimeError: capture |' in text
    assert 'the stream generated in 12.5 s' in text
    # a report without the pairs (written before them) pairs on the fly
    del result['pairs']
    assert '\n'.join(gpu_report.md_loop(result)) == text


def test_a_failed_loop_run_is_reported_and_the_next_runs(
        tmp_path, monkeypatch, gpu_check):
    """A run that raises (e.g. a graph capture) is reported with its
    error, the next still runs, the report is written before and after
    each run; the step fails at its end naming the failed run."""
    from benchmarks import loop_benchmark
    args = gpu_check.parse_args(['--only', 'loop', '--loop-methods',
                                 'tent-stag_bf16-graph:40', 'tent-stag:40',
                                 'tent_bf16-graph:40', 'tent:40'])
    saved = []
    ctx = SimpleNamespace(
        args=args, cuda=True, repo=REPO, tmp=str(tmp_path),
        checkpoint=lambda: 'ckpt', data_root=lambda: 'root',
        seg_options=dict, generate_seconds=3.0,
        save_partial=lambda r: saved.append(json.loads(json.dumps(r))))
    runs = []

    def run_method(method, run_args, work_root):
        runs.append((method, run_args.images, run_args.warmup))
        if method == 'tent_bf16-graph':
            raise RuntimeError('CUDA error: operation not permitted when '
                               'stream is capturing')
        row = loop_row(40, 8.0 if 'bf16' in method else 4.0, 100.0, [10.0])
        del row['status'], row['images_asked']  # the step's own keys
        return row

    monkeypatch.setattr(loop_benchmark, 'run_method', run_method)
    with pytest.raises(RuntimeError, match=r'loop: 1 of 4 runs failed .*'
                       r'tent_bf16-graph: RuntimeError: CUDA error'):
        gpu_steps.measure_loop(ctx)
    assert runs == [('tent-stag_bf16-graph', 40, 8), ('tent-stag', 40, 8),
                    ('tent_bf16-graph', 40, 8), ('tent', 40, 8)]
    # before each run: it is named as running; after it: its figures
    assert saved[0]['methods'] == {'tent-stag_bf16-graph': dict(
        status='running', images_asked=40)}
    last = saved[-1]
    assert [r['status'] for r in last['methods'].values()] == [
        'ok', 'ok', 'failed', 'ok']
    failed = last['methods']['tent_bf16-graph']
    assert 'stream is capturing' in failed['error']
    assert 'Traceback' in failed['traceback']
    assert [p['preset'] for p in last['pairs']] == ['tent-stag_bf16-graph']
    assert last['pairs'][0]['speedup'] == pytest.approx(2.0)
    assert last['generate_seconds'] == 3.0
    # a run stopped during the third run: the report says so
    text = '\n'.join(gpu_report.md_loop(saved[4]))
    assert '| tent_bf16-graph | running (not finished' in text


def test_the_stream_is_generated_in_chunks(tmp_path, gpu_check):
    """The stream's conditions cut into chunks (one process each): the
    same files as one job per condition writes."""
    jobs = gpu_check.generation_jobs(str(tmp_path / 'a'), 7, (16, 8), 16)
    # 4 chunks per condition, of an even size
    assert [(j[1], j[2], j[5]) for j in jobs[:4]] == [
        ('fog', 2, 0), ('fog', 2, 2), ('fog', 2, 4), ('fog', 1, 6)]
    assert len(jobs) == 16 and jobs[0][4] == 0 and jobs[4][4] == 1
    # one core: one job per condition, as before
    assert [(j[2], j[4], j[5]) for j in gpu_check.generation_jobs(
        'r', 7, (16, 8), 2)] == [(7, k, 0) for k in range(4)]
    for job in jobs:
        gpu_check.generate_condition(job)
    from demo_data import make_acdc_like_tree
    make_acdc_like_tree(str(tmp_path / 'b'), images_per_condition=7,
                        size=(16, 8))

    def files(root):
        return sorted(osp.relpath(osp.join(d, f), root)
                      for d, _, names in os.walk(root) for f in names)

    assert files(tmp_path / 'a') == files(tmp_path / 'b')
    assert len(files(tmp_path / 'a')) == 2 * 4 * 7
