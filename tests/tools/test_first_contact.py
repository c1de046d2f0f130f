"""``tools/gpu_check.py --first-contact`` without a GPU: it refuses in one
sentence naming CUDA before any work; in development mode (``--allow-cpu
--quick``) its arms run, each in its own process, through the shipped
presets on the CPU with the stand-in graph (``benchmarks.stand_in_graph``:
a capture and its replays as the loop sees them, the step's Python run on
the captured inputs), and its comparisons pass; a comparison fails where a
replay updates nothing, steps on the captured batch, or never replays on a
new one. No timing is asserted."""
import json
import os
import os.path as osp
import sys

import pytest
import tool_runs
import torch

from benchmarks import first_contact

REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))


def run_gpu_check(*args, timeout=900):
    env = dict(os.environ, CUDA_VISIBLE_DEVICES='', OMP_NUM_THREADS='1')
    return tool_runs.run(
        [sys.executable, osp.join(REPO, 'tools/gpu_check.py'), *args],
        capture_output=True, text=True, cwd=REPO, env=env, timeout=timeout)


def test_without_cuda_it_refuses_in_one_sentence_before_any_work(tmp_path):
    out = tmp_path / 'report'
    proc = run_gpu_check('--first-contact', '--out-dir', str(out))
    assert proc.returncode == 2
    message = proc.stderr.strip()
    assert message.startswith('gpu_check --first-contact needs a CUDA '
                              'device'), message
    assert message.count('. ') == 0 and message.endswith('nothing was run.')
    assert not out.exists()


def test_the_plan_pairs_every_graph_preset_with_itself_eager():
    arms, comparisons = first_contact.plan(16, 3)
    by_name = {a.name: a for a in arms}
    assert len(by_name) == len(arms)
    graphed = {c.name: (by_name[c.graph], by_name[c.eager])
               for c in comparisons if c.kind == 'graph'}
    for graph, eager in graphed.values():
        assert graph.config == eager.config and eager.graph is False
        assert graph.graph in (None, True) and graph.lr == eager.lr
    configs = {g.config for g, _ in graphed.values()}
    assert configs == {'tent_bf16-graph', 'tent-stag_bf16-graph',
                       'cotta_bf16-graph', 'cotta-stag_bf16-graph',
                       'bn-adapt_bf16'}
    assert by_name['cotta graph'].images == 3
    assert by_name['tent-stag graph, 0 workers'].workers == 0
    noise = [c for c in comparisons if c.kind == 'noise']
    assert [(by_name[c.graph].graph, by_name[c.eager].graph)
            for c in noise] == [(False, False)]
    assert all(a.lr == first_contact.CHECK_LR for a in arms
               if not a.config.startswith('bn-adapt'))


ARMS = ('tent-stag graph', 'tent-stag eager', 'bn-adapt graph',
        'bn-adapt eager')


def test_quick_cpu_run_of_the_arms_passes_and_reports(tmp_path):
    """Four arms (TENT+STAG's preset and BN Adapt's without STAG, each
    graphed and eager), on the stand-in graph: each process ran its
    config, the graph arms captured once and replayed on new batches
    across the stage restart, and the losses, updates and scores agree
    with the eager arms' (float32 on the CPU: to rounding)."""
    out = tmp_path / 'report'
    proc = run_gpu_check('--first-contact', '--allow-cpu', '--quick',
                         '--out-dir', str(out), '--first-contact-images', '4',
                         '--first-contact-arms', *ARMS)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-6000:]
    assert '[first-contact] PASS' in proc.stdout
    report = json.loads((out / 'first_contact.json').read_text())
    assert report['stand_in'] is True and report['passed'] is True
    assert report['code']['commit']
    assert set(report['arms']) == set(ARMS)
    for name, arm in report['arms'].items():
        assert arm['status'] == 'ok', (name, arm.get('error'))
        assert arm['images'] == 8 and arm['images_per_s'] > 0
        assert len(arm['scores']) == 2
    tent, bn = report['arms']['tent-stag graph'], report['arms'][
        'bn-adapt graph']
    # per stage of 4: 2 eager, then the capture (and its replay), the
    # next stage replayed on the graph kept through the optimizer restart
    assert (tent['captures'], tent['eager_steps'], tent['replays'],
            tent['replays_on_new']) == (1, 2, 6, 5)
    assert (bn['captures'], bn['replays'], bn['trainable']) == (1, 6, 0)
    assert tent['num_updates'] == 8 and len(tent['losses']['loss']) == 8
    (tent_c, bn_c) = report['comparisons']
    assert tent_c['passed'] and bn_c['passed'], report['comparisons']
    assert tent_c['loss']['rel'] < 1e-5 and tent_c['update']['rel'] < 1e-4
    assert tent_c['update']['eager_norm'] > 0
    page = (out / 'first_contact.md').read_text()
    assert 'Verdict: PASS' in page and 'stand-in graph on the CPU' in page
    assert report['code']['commit'] in page


def arm_result(tmp_path, name, losses, weights, **counts):
    path = str(tmp_path / f'{name}.pt')
    torch.save(weights, path)
    return dict(dict(status='ok', losses=dict(loss=losses), scores=[50.0],
                     num_updates=len(losses), weights=path, captures=1,
                     replays=3, replays_on_new=2, eager_steps=2), **counts)


@pytest.mark.parametrize('fault', ['none', 'no update', 'captured batch',
                                   'never replays on new', 'no capture',
                                   'an arm failed', 'a wait inside a stage'])
def test_a_comparison_fails_where_the_graph_is_wrong(fault, tmp_path):
    source = {'w': torch.zeros(4)}
    eager = arm_result(tmp_path, 'e', [1.0, 0.9, 0.8, 0.7],
                       {'w': torch.tensor([1e-3, -1e-3, 1e-3, 1e-3])})
    graph = dict(losses=[1.0, 0.9, 0.8, 0.7],
                 weights={'w': torch.tensor([1e-3, -1e-3, 1e-3, 1e-3])})
    counts = {}
    if fault == 'no update':  # replays that step nothing
        graph['weights'] = {'w': torch.tensor([5e-4, -5e-4, 5e-4, 5e-4])}
    elif fault == 'captured batch':  # every replay on the captured inputs
        graph['losses'] = [1.0, 0.9, 0.9, 0.9]
        graph['weights'] = {'w': torch.tensor([1e-3, 1e-3, 1e-3, -1e-3])}
    elif fault == 'never replays on new':
        counts = dict(replays_on_new=0)
    elif fault == 'no capture':
        counts = dict(captures=0, replays=0, replays_on_new=0)
    # the first batches' and a stage end's waits are not faults
    waits = [dict(batch=0, site='init'), dict(batch='stage end', site='x')]
    if fault == 'a wait inside a stage':
        waits.append(dict(batch=5, site='engine/online_loop.py:1 step'))
    counts['waits'] = waits
    results = dict(e=eager, g=arm_result(tmp_path, 'g', **graph, **counts))
    if fault == 'an arm failed':
        results['g'] = dict(status='failed', error='CUDA error')
    got = first_contact.compare(first_contact.Comparison('x', 'g', 'e'),
                                results, source)
    assert got['passed'] == (fault == 'none'), got
    if fault != 'none':
        assert got['why']
    if fault == 'a wait inside a stage':
        assert got['waits'] == dict(graph=1) and 'batch 5' in got['why']
    noise = first_contact.compare(first_contact.Comparison(
        'n', 'g', 'e', kind='noise'), results, source)
    assert noise['passed'] is (False if fault == 'an arm failed' else None)


def test_a_failed_or_stuck_arm_is_reported_and_the_next_runs(tmp_path):
    """Each arm in its own process: one that raises is recorded with its
    error, one past its time limit is killed and recorded, one after the
    budget is skipped; the report is saved after each."""
    arms = [first_contact.Arm('bad', 'no-such-config', 4),
            first_contact.Arm('slow', 'tent-stag_bf16-graph', 4),
            first_contact.Arm('late', 'tent-stag_bf16-graph', 4)]
    saved = []

    # a config file MMEngine executes, and which never returns
    slow = tmp_path / 'slow.py'
    slow.write_text('import time\ntime.sleep(120)\n')

    def make_spec(arm):
        config = str(slow) if arm.name == 'slow' else osp.join(
            REPO, 'configs/stag_acdc', f'{arm.config}.py')
        return dict(config=config, options='{}', checkpoint='none.pth',
                    work_dir=str(tmp_path / arm.name),
                    weights=str(tmp_path / f'{arm.name}.pt'),
                    stand_in=True, repo=REPO)

    results = first_contact.run_arms(arms[:2], make_spec, str(tmp_path),
                                     3.0, float('inf'), lambda r: saved.append(
                                         list(r)))
    assert results['bad']['status'] == 'failed'
    assert 'no-such-config' in results['bad']['error']
    assert results['slow']['status'] == 'failed'
    assert 'timed out after 3 s' in results['slow']['error']
    assert saved == [['bad'], ['bad', 'slow']]
    # past the budget: recorded, not started
    late = first_contact.run_arms(arms[2:], make_spec, str(tmp_path), 3.0,
                                  0.0, lambda r: None)
    assert late['late']['status'] == 'skipped'
