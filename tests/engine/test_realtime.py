"""``test_cfg.realtime``: the realistic online protocol (Alfarra et al.,
ICML 2024). The schedule against a transcription of the authors'
``delayed_eval_online`` delay counter, for integer and non-integer costs;
``cost=1`` is the offline run to the bit; a batch predicted only is a
forward of the current weights and changes nothing; ``'measure'``
restores what it timed (its run equals the run of the cost it recorded);
a killed realistic run resumes to the uninterrupted result; the
refusals."""
import copy
import json
import math
import os.path as osp
import random
import signal
import sys

import pytest
import torch
from mmengine.hooks import Hook
from run_helpers import killable_config, numbers, run_config
from seg_helpers import (REPO, SEG_CFG, as_cli, make_runner, python_path,
                         run_script, tiny_options)

from demo_data import make_acdc_like_tree
from mmseg_stag.engine.realtime import (Realtime, realtime_options,
                                        stage_positions)

CONFIG = osp.join(REPO, SEG_CFG.format('tent-stag'))


@pytest.fixture(scope='module')
def acdc5(tmp_path_factory):
    """Five images a condition: a stage long enough for costs 1.5, 2, 2.5
    and 4 to adapt on different batches."""
    root = tmp_path_factory.mktemp('acdc5')
    return str(make_acdc_like_tree(str(root), images_per_condition=5,
                                   size=(96, 48), seed=1))


# ---------------------------------------------- the authors' delay counter
def authors_schedule(stages, ratio, eta=1.0):
    """MotasemAlfarra/Online_Test_Time_Adaptation, utils/online_eval.py,
    ``delayed_eval_online``, the adapt-or-not decision of each batch,
    transcribed: one call per corruption (``delay = 0`` at its start),
    the ratio of a step's time to a forward's constant."""
    adapted = []
    for batches in stages:
        delay = 0
        for _ in range(batches):
            if delay == 0:  # compute the output and delay for this batch
                adapted.append(True)
                delay += max(0, math.ceil(ratio * eta) - 1)
            else:  # previous expensive algorithm is still running
                adapted.append(False)
                delay -= 1
    return adapted


def our_schedule(stages, cost):
    realtime = realtime_options(dict(cost=cost))
    stage_of = [s for s, batches in enumerate(stages) for _ in range(batches)]
    return [realtime.adapts(k) for k in stage_positions(stage_of)]


@pytest.mark.parametrize('cost', [0.25, 1, 1.0000001, 1.5, 2, 2.5, 3, 7.9])
def test_the_schedule_is_the_authors_delay_counter(cost):
    stages = [5, 1, 8, 13, 2]
    assert our_schedule(stages, cost) == authors_schedule(stages, cost)


def test_random_costs_and_stages_match_the_authors():
    rng = random.Random(0)
    for _ in range(200):
        stages = [rng.randint(1, 30) for _ in range(rng.randint(1, 6))]
        cost = rng.uniform(0.05, 12.0)
        assert our_schedule(stages, cost) == authors_schedule(stages, cost)


def test_which_batches_adapt_for_given_costs():
    """A step of C forwards: the batches that arrive while it runs are
    predicted only, whole batches (ceil), each stage from its first."""
    assert our_schedule([7], 1) == [True] * 7
    assert our_schedule([7], 1.5) == [True, False] * 3 + [True]
    assert our_schedule([7], 2.5) == [True, False, False] * 2 + [True]
    assert our_schedule([3, 3], 2) == [True, False, True] * 2
    assert stage_positions([0, 0, 0, 1, 1, 2]) == [0, 1, 2, 0, 1, 0]
    assert Realtime(2.5, 'given').record(3, 7) == dict(
        cost=2.5, how='given', period=3, batches_adapted=3,
        batches_predicted_only=4, measured=None)


@pytest.mark.parametrize('cfg, says', [
    (dict(cost=0), 'number > 0'), (dict(cost=-1.5), 'number > 0'),
    (dict(cost=float('nan')), 'number > 0'), (dict(cost=True), '> 0'),
    (dict(cost='fast'), "'measure'"), (dict(), 'cost required'),
    (dict(cost=2, speed=1), 'takes cost, warmup, repeats'),
    (dict(cost=2, warmup=3), "is for cost='measure'"),
    (dict(cost='measure', repeats=0), 'repeats must be an integer >= 1'),
    (dict(cost='measure', warmup=-1), 'warmup must be an integer >= 0'),
    (2.5, 'must be a dict')])
def test_bad_options_are_refused_by_name(cfg, says):
    with pytest.raises(ValueError, match='test_cfg.realtime') as err:
        realtime_options(cfg)
    assert says in str(err.value)


def test_measure_is_refused_where_the_step_cannot_be_timed():
    with pytest.raises(ValueError, match="'measure' times eager steps"):
        realtime_options(dict(cost='measure'), cuda_graph=True)
    assert realtime_options(dict(cost=3), cuda_graph=True).period == 3


# ------------------------------------------------------------- the loop
def run(acdc5, checkpoint, work_dir, realtime=None, extra=None):
    opts = dict(tiny_options(acdc5, rounds=1), **(extra or {}))
    if realtime is not None:
        opts['test_cfg.realtime'] = realtime
    return run_config(CONFIG, checkpoint, work_dir, opts)


def final_weights(work_dir):
    state = torch.load(osp.join(str(work_dir),
                                'online_adaptation_state.pth'),
                       weights_only=True)
    return state['method']['model']


def test_cost_one_is_the_offline_run_to_the_bit(acdc5, tiny_checkpoint,
                                                tmp_path):
    offline = run(acdc5, tiny_checkpoint, tmp_path / 'offline')
    realistic = run(acdc5, tiny_checkpoint, tmp_path / 'rt', dict(cost=1))
    assert realistic['realtime'] == dict(
        cost=1.0, how='given', period=1, batches_adapted=20,
        batches_predicted_only=0, measured=None)
    realistic = numbers(realistic)
    del realistic['realtime']
    for stage in realistic['stages']:
        assert stage.pop('images_adapted') == stage['num_images']
    assert realistic == numbers(offline)
    a, b = (final_weights(tmp_path / d) for d in ('offline', 'rt'))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


class PredictedOnly(Hook):
    """At each batch the schedule predicts only: the weights before and
    after, and a forward of a copy of the current model."""

    def __init__(self):
        self.checked, self.adapted = 0, []

    def before_test_iter(self, runner, batch_idx, data_batch=None):
        loop = runner.test_loop
        self.before = copy.deepcopy(loop.method.model)

    def after_test_iter(self, runner, batch_idx, data_batch=None,
                        outputs=None):
        loop = runner.test_loop
        adapted = outputs[0].metainfo['adapted']
        self.adapted.append(adapted)
        now = dict(loop.method.model.state_dict())
        same = all(torch.equal(v, now[k]) for k, v in
                   self.before.state_dict().items())
        assert same != adapted, batch_idx
        if adapted:
            return
        # what a forward of the weights as they were gives
        batch = loop.task.batch(runner.model, copy.deepcopy(data_batch))
        with torch.no_grad():
            fwd = loop.method.task_adapter.forward(self.before, batch)
        expected = loop.task.outputs(batch, loop.method.prediction(fwd))
        assert torch.equal(expected[0].pred_sem_seg.data,
                           outputs[0].pred_sem_seg.data)
        self.checked += 1


def test_a_batch_predicted_only_is_a_forward_of_the_current_weights(
        acdc5, tiny_checkpoint, tmp_path):
    runner = make_runner('tent-stag', acdc5, tiny_checkpoint, tmp_path,
                         extra={'test_cfg.realtime': dict(cost=2.5),
                                'test_dataloader.dataset.rounds': 1})
    hook = PredictedOnly()
    runner.register_hook(hook)
    runner.test()
    assert hook.adapted == [True, False, False, True, False] * 4
    assert hook.checked == 12
    loop = runner.test_loop
    assert loop.num_updates + loop.method.num_updates == 8
    with open(tmp_path / 'continual_results.json') as f:
        record = json.load(f)
    assert record['realtime']['batches_adapted'] == 8
    assert [s['images_adapted'] for s in record['stages']] == [2] * 4


def test_measure_restores_what_it_timed(acdc5, tiny_checkpoint, tmp_path):
    """The measured run is the run of its recorded cost, to the bit: the
    timing steps leave no trace in the weights, the method or the random
    states."""
    measured = run(acdc5, tiny_checkpoint, tmp_path / 'm',
                   dict(cost='measure', warmup=1, repeats=2))
    info = measured['realtime']
    assert info['how'] == 'measured' and info['cost'] > 0
    timed = info['measured']
    assert timed['step_seconds'] > 0 and timed['forward_seconds'] > 0
    assert info['cost'] == timed['step_seconds'] / timed['forward_seconds']
    assert timed['device'] == 'cpu' and timed['repeats'] == 2
    given = run(acdc5, tiny_checkpoint, tmp_path / 'g',
                dict(cost=info['cost']))
    assert given['stages'] == measured['stages']
    a, b = (final_weights(tmp_path / d) for d in ('m', 'g'))
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_a_killed_realistic_run_resumes_to_the_uninterrupted_result(
        acdc5, tiny_checkpoint, tmp_path):
    """Killed before its third stage (the test-only hook), resumed: the
    result of the run never killed; the measured cost is the saved one,
    not measured again."""
    # as a user gives it: --cfg-options test_cfg.realtime.cost=measure
    opts = dict(tiny_options(acdc5, rounds=1), **{
        'test_cfg.realtime.cost': 'measure', 'test_cfg.realtime.warmup': 0,
        'test_cfg.realtime.repeats': 1})
    config = killable_config(CONFIG, {}, tmp_path)

    def test_py(work_dir, *extra, kill=None):
        env = dict(PYTHONPATH=python_path(osp.join(REPO, 'tests')))
        if kill:
            env['KILL_AT_STAGE'] = kill
        return run_script(
            [sys.executable, osp.join(REPO, 'tools/test.py'), config,
             tiny_checkpoint, '--work-dir', str(work_dir), *extra,
             '--cfg-options'] + as_cli(opts), cwd=REPO, **env)

    cut, whole = tmp_path / 'cut', tmp_path / 'whole'
    proc = test_py(cut, kill='2,1')
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]
    assert 'realtime: measured' in proc.stdout + proc.stderr
    saved = torch.load(cut / 'online_adaptation_state.pth',
                       weights_only=True)
    assert saved['batches_done'] == 10
    proc = test_py(cut, '--resume')
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert 'realtime: measured' not in proc.stdout + proc.stderr
    with open(cut / 'continual_results.json') as f:
        resumed = json.load(f)
    assert resumed['realtime']['measured'] == saved['realtime']['measured']
    del opts['test_cfg.realtime.warmup'], opts['test_cfg.realtime.repeats']
    opts['test_cfg.realtime.cost'] = resumed['realtime']['cost']
    proc = test_py(whole)
    assert proc.returncode == 0, proc.stderr[-3000:]
    with open(whole / 'continual_results.json') as f:
        assert json.load(f)['stages'] == resumed['stages']


def test_the_command_line_refuses_a_bad_cost_before_any_work(tmp_path):
    """``tools/test.py --realtime``: a number > 0 or ``measure``, told by
    argparse; on a config of MMEngine's plain loop, refused by name."""
    from mmengine.config import Config

    from mmseg_stag.engine.runs import prepare_config
    for bad in ('0', '-2', 'fast', 'inf'):
        proc = run_script([sys.executable, osp.join(REPO, 'tools/test.py'),
                           CONFIG, 'missing.pth', '--realtime', bad],
                          cwd=REPO)
        assert proc.returncode == 2, proc.stderr[-2000:]
        assert 'a number > 0, or measure' in proc.stderr
    plain = Config(dict(test_cfg=dict(type='TestLoop')))
    with pytest.raises(ValueError, match='--realtime is a protocol of '
                       'online adaptation'):
        prepare_config(plain, str(tmp_path), realtime=2.0)
    cfg = Config.fromfile(CONFIG)
    assert prepare_config(cfg, str(tmp_path), realtime='measure'
                          ).test_cfg.realtime == dict(cost='measure')
