"""How far one batch travels: an ACDC TENT+STAG batch from the loop's
``run_iter`` to the metric, as the calls between the package's files that
``sys.setprofile`` sees (docs/segmentation.md "How one batch flows" lists
them). A call counts where the nearest caller of the package is in another
file of the package, whatever library frames lie between (``nn.Module``'s
``__call__``, MMEngine's evaluator); not counted: a record's generated
constructor, and the callbacks torch makes (the probe's forward hook,
autograd's backward functions)."""
import os.path as osp
import sys

from seg_helpers import make_runner

import mmseg_stag

PACKAGE = osp.dirname(mmseg_stag.__file__) + osp.sep
#: what torch calls back, not the package
CALLBACKS = {'core/probe.py:hook', 'core/stag.py:backward'}

#: the steady state's calls (the third batch, the second stage's first:
#: the anchors and the shape checks are done, no log line, no stage end),
#: the defaults
EXPECTED = [
    ('engine/online_loop.py:step', 'segmentation/online_task.py:batch'),
    # the batch to the device without a wait (non_blocking), both tasks'
    ('segmentation/online_task.py:batch', 'engine/online_task.py:preprocess'),
    ('engine/online_loop.py:step', 'core/methods/base.py:adapt'),
    ('core/methods/base.py:beta', 'core/stag.py:stag_beta'),
    ('core/methods/base.py:forward_and_adapt',
     'segmentation/task_adapter.py:forward'),
    ('segmentation/task_adapter.py:forward', 'core/probe.py:run_probe'),
    ('core/methods/base.py:loss', 'core/methods/tent.py:base_loss'),
    ('core/methods/tent.py:base_loss',
     'segmentation/task_adapter.py:cross_entropy_at_original_size'),
    ('core/methods/base.py:add_stag', 'core/losses.py:mean_over_outputs'),
    ('core/losses.py:mean_over_outputs', 'core/stag_loss.py:forward'),
    ('core/stag_loss.py:forward', 'core/stag.py:batch_alignment'),
    ('engine/online_loop.py:step', 'segmentation/online_task.py:outputs'),
    ('engine/online_loop.py:run_iter', 'engine/stream_metric.py:process'),
    ('engine/stream_metric.py:process',
     'segmentation/evaluation/continual_metric.py:image_record'),
]


def where(frame):
    return (osp.relpath(frame.f_code.co_filename, PACKAGE).replace(
        osp.sep, '/') + ':' + frame.f_code.co_name)


def cross_file_calls(loop, idx):
    """Run the loop, tracing batch ``idx``; return its cross-file calls."""
    calls, run_iter = [], loop.run_iter

    def profile(frame, event, arg):
        if event != 'call' or \
                not frame.f_code.co_filename.startswith(PACKAGE):
            return
        caller = frame.f_back
        while caller is not None and \
                not caller.f_code.co_filename.startswith(PACKAGE):
            caller = caller.f_back
        if caller is not None and \
                caller.f_code.co_filename != frame.f_code.co_filename and \
                where(frame) not in CALLBACKS:
            calls.append((where(caller), where(frame)))

    def traced(i, data_batch):
        if i != idx:
            return run_iter(i, data_batch)
        sys.setprofile(profile)
        try:
            return run_iter(i, data_batch)
        finally:
            sys.setprofile(None)

    loop.run_iter = traced
    loop.runner.test()
    return calls


def test_one_tent_stag_batch_in_fourteen_cross_file_calls(
        tiny_acdc, tiny_checkpoint, tmp_path):
    runner = make_runner('tent-stag', tiny_acdc, tiny_checkpoint, tmp_path,
                         extra={'test_dataloader.dataset.indices': 4,
                                'default_hooks.logger.interval': 10})
    calls = cross_file_calls(runner.test_loop, 2)
    assert calls == EXPECTED, "\n".join(map(str, calls))
    assert len(calls) <= 14
    files = {f.split(':')[0] for call in calls for f in call}
    assert len(files) == 12, sorted(files)
