"""Two ``StreamMetric`` of one run (``test_evaluator`` a list), through
``tools/test.py``'s run on the real CIFAR-10-C config with the tiny CNN and
stream: each writes its own result files (the first the plain names, the
second behind its prefix) and neither overwrites the other; a run
interrupted mid-stream resumes both; two metrics that would write the same
files are refused before the first batch; ``tools/test.py --out DIR``
sends both metrics' files there."""
import os.path as osp

import pytest
import torch
from cls_helpers import CIFAR, killable_config, options, run_tool
from mmengine.config import Config
from mmengine.hooks import Hook
from run_helpers import numbers

from mmseg_stag.engine.report import read_partial, read_results
from mmseg_stag.engine.run_state import STATE_FILE
from mmseg_stag.engine.runs import prepare_config, run_test

#: the config's metric (the paper's table shows err) and a second one
TWO = [dict(type='StreamAccuracyMetric', table_metric='err'),
       dict(type='StreamAccuracyMetric', table_metric='acc',
            prefix='second')]
#: what each metric writes: the first these names, the second ``second_*``
FILES = ('continual_results.json', 'continual_results.csv',
         'continual_acc.png', 'continual_results.partial.jsonl',
         'per_image.csv')


class Interrupt(Exception):
    """The crash of :class:`StopAtStage`."""


class StopAtStage(Hook):
    """Raise before the first batch of stage ``stage`` (a crash after the
    state of the stages before it was saved)."""

    def __init__(self, stage: int):
        self.stage = stage

    def before_test_iter(self, runner, batch_idx, data_batch=None):
        if runner.test_loop.schedule[batch_idx].stage.index == self.stage:
            raise Interrupt(f'stopped at stage {self.stage}')


def run_two(root, names, checkpoint, work_dir, evaluator=TWO, hooks=(),
            resume=False):
    """The tent-stag run with ``evaluator``; the evaluator's metrics."""
    cfg = Config.fromfile(CIFAR.format('tent-stag'))
    cfg.merge_from_dict(options(root, names, batch_size=8,
                                test_evaluator=evaluator))
    metrics, _ = run_test(prepare_config(cfg, str(work_dir), resume=resume),
                          checkpoint, hooks=hooks)
    return metrics


def test_two_metrics_keep_both_files(tmp_path, stream, names, checkpoint):
    _, root = stream
    work = tmp_path / 'run'
    metrics = run_two(root, names, checkpoint, work)
    first, second = read_results(str(work)), read_results(str(work),
                                                          'second')
    # each file is its own metric's: the first's table shows err
    assert first['details']['table_metric'] == 'err'
    assert second['details']['table_metric'] == 'acc'
    # the same images scored by the same rule: the same stages
    assert first['stages'] == second['stages'] and len(first['stages']) == 3
    for name in FILES:
        assert (work / name).stat().st_size > 0, name
        assert (work / f'second_{name}').stat().st_size > 0, name
    assert read_partial(str(work)) == first['stages']
    assert read_partial(str(work), 'second') == second['stages']
    assert (work / 'per_image.csv').read_text() == \
        (work / 'second_per_image.csv').read_text()
    assert metrics['stream/acc_mean_over_stages'] == \
        metrics['second/acc_mean_over_stages']


def test_two_metrics_resume(tmp_path, stream, names, checkpoint):
    """Interrupted in its third stage and resumed: both metrics' files
    equal the uninterrupted run's (the run state holds each metric's
    records, restored into its own metric and partial file)."""
    _, root = stream
    whole, cut = tmp_path / 'whole', tmp_path / 'cut'
    run_two(root, names, checkpoint, whole)
    with pytest.raises(Interrupt):
        run_two(root, names, checkpoint, cut, hooks=[StopAtStage(2)])
    state = torch.load(osp.join(str(cut), STATE_FILE), weights_only=True)
    assert state['batches_done'] == 10 and len(state['metrics']) == 2
    assert len(read_partial(str(cut))) == 2
    assert len(read_partial(str(cut), 'second')) == 2
    assert not (cut / 'continual_results.json').exists()
    run_two(root, names, checkpoint, cut, resume=True)
    for prefix in ('', 'second'):
        assert numbers(read_results(str(cut), prefix)) == \
            numbers(read_results(str(whole), prefix))
        assert read_partial(str(cut), prefix) == \
            read_partial(str(whole), prefix)
    for name in ('per_image.csv', 'second_per_image.csv'):
        assert (cut / name).read_text() == (whole / name).read_text()


def test_two_metrics_of_one_prefix_are_refused_at_the_start(
        tmp_path, stream, names, checkpoint):
    _, root = stream
    same = [dict(type='StreamAccuracyMetric', table_metric='err'),
            dict(type='StreamAccuracyMetric', table_metric='acc')]
    with pytest.raises(ValueError, match=(
            r"test_evaluator\[0\] \(StreamAccuracyMetric, prefix 'stream'\) "
            r"and test_evaluator\[1\] \(StreamAccuracyMetric, prefix "
            r"'stream'\) would write the same.*give test_evaluator\[1\] a "
            r'prefix of its own')):
        run_two(root, names, checkpoint, tmp_path / 'run', evaluator=same)
    # before the first batch: no stage was scored
    assert not (tmp_path / 'run' / 'continual_results.partial.jsonl').exists()


def test_tools_test_out_sends_both_metrics_there(tmp_path, stream, names,
                                                 checkpoint):
    """``--out`` sets every metric's ``output_dir`` (a list of metrics and
    the classification metric included); the work dir keeps the log and
    the run state."""
    _, root = stream
    config = killable_config(CIFAR.format('tent-stag'), options(
        root, names, batch_size=20, test_evaluator=TWO), tmp_path,
        kill=False)
    work, out = tmp_path / 'work', tmp_path / 'out'
    proc = run_tool(config, checkpoint, '--work-dir', str(work), '--out',
                    str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    for name in FILES:
        assert (out / name).is_file() and (out / f'second_{name}').is_file()
        assert not (work / name).exists()
    assert (work / STATE_FILE).is_file()
    assert read_results(str(out))['details']['table_metric'] == 'err'
    assert read_results(str(out), 'second')['details']['table_metric'] == \
        'acc'
