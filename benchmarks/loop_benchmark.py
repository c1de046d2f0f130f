"""The loop benchmark (``tools/benchmark_loop.py``, ``tools/gpu_check.py``):
one method's config through MMEngine's ``Runner`` on the first images of a
stream, timed per batch by a hook, its classifier's calls counted."""
import logging
import os.path as osp
import time
import uuid

import torch

from mmseg_stag.core import METHODS, TENT, StepStats
from mmseg_stag.engine.online_task import head_layer_of


class TwoForwardTENT(TENT):
    """TENT as CoTTA's ``single_gpu_tent`` runs it: the prediction from a
    forward without gradients, the loss from a second forward. A speed
    reference, put into ``METHODS`` (as ``tent_two_forward``) by
    :func:`build_runner` for the run that uses it, not by an import.

    Raises:
        ValueError: If the config's TENT loss is not CoTTA's ACDC loss.
    """

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        if self.loss_type != 'pseudo_ce_fullres':
            raise ValueError("the two-forward reference is CoTTA's ACDC TENT:"
                             " loss='pseudo_ce_fullres', got "
                             f'{self.loss_type!r}')

    def forward_and_adapt(self, batch, beta=None):
        with torch.no_grad():  # as model(return_loss=False)
            prediction = self.task_adapter.forward(self.model, batch)
        fwd = self.task_adapter.forward(self.model, batch)  # the loss's own
        labels = self.task_adapter.labels_at_original_size(batch, prediction)
        self.backward_step(self.add_stag(
            self.task_adapter.cross_entropy_at_original_size(
                fwd, labels, self.align_corners), fwd, beta))
        return self.prediction(prediction), StepStats([fwd.stats])


def build_runner(config, args, work_dir, method):
    """MMEngine's runner of ``config`` on the first ``args.images`` images
    at ``args.data_root``, ``args.checkpoint`` loaded."""
    from mmengine.config import Config
    from mmengine.runner import Runner

    from mmseg_stag.checkpoint import load_segmentor_checkpoint
    cfg = Config.fromfile(config)
    cfg.merge_from_dict(dict(args.cfg_options, **{
        'test_dataloader.dataset.data_root': args.data_root,
        'test_dataloader.dataset.indices': args.images,
        'test_cfg.save_state': False}))
    if method == 'two-forward':
        # the loop builds its method from METHODS by name; registered here,
        # by the run that needs it (force: a second run registers it again)
        METHODS.register_module(name='tent_two_forward',
                                module=TwoForwardTENT, force=True)
        cfg.test_cfg.method.type = 'tent_two_forward'
    cfg.work_dir = work_dir
    cfg.experiment_name = f'loop_{method}_{uuid.uuid4().hex[:6]}'
    cfg.load_from = None
    runner = Runner.from_cfg(cfg)
    load_segmentor_checkpoint(runner.model, args.checkpoint,
                              head_layer=head_layer_of(cfg))
    return runner


def loop_timer():
    """An observing hook: the time the stream starts (``before_test``,
    before the loader's workers start) and at the end of every batch (CUDA
    synchronised), the peak CUDA memory allocated (read before MMEngine's
    log processor resets the counter at its interval) and the classifier's
    calls (``count``, a forward hook)."""
    from mmengine.hooks import Hook

    class LoopTimer(Hook):
        # before the LoggerHook, whose log processor resets the peak
        priority = 'VERY_HIGH'

        def __init__(self):
            self.times, self.calls, self.peak = [], 0, 0
            self.start = None

        def count(self, *_):
            self.calls += 1

        def before_test(self, runner):
            self.start = time.perf_counter()

        def after_test_iter(self, runner, batch_idx, data_batch=None,
                            outputs=None):
            if torch.cuda.is_available():
                torch.cuda.synchronize()
                self.peak = max(self.peak, torch.cuda.max_memory_allocated())
            self.times.append(time.perf_counter())

    return LoopTimer()


def images_per_second(times, warmup):
    """Images per second from the end of the last warm-up batch (of the
    first batch without warm-up)."""
    first = max(warmup, 1) - 1
    seconds = times[-1] - times[first]
    return (len(times) - 1 - first) / seconds if seconds > 0 else None


def method_config(pattern, method):
    """The config of ``method`` (``two-forward``: TENT's) by ``pattern``
    (a path with ``{}`` for the method)."""
    return pattern.format('tent' if method == 'two-forward' else method)


def stage_scores(work_dir):
    """The stages of the run in ``work_dir`` (its
    ``continual_results.json``): ``[dict(stage, round, condition, score,
    num_images)]``, the score in points (mIoU); None if the run wrote
    none."""
    from mmseg_stag.engine.report import read_results
    try:
        record = read_results(work_dir)
    except (FileNotFoundError, ValueError):
        return None
    return [dict(stage=s['stage'], round=s['round'],
                 condition=s['condition'], score=s['score'],
                 num_images=s.get('num_images')) for s in record['stages']]


def close_log_files(runner):
    """Close the run's log files (``tools/test.py``'s ``run_test`` does
    so too): runs in one process do not keep each other's open."""
    for handler in list(runner.logger.handlers):
        if isinstance(handler, logging.FileHandler):
            handler.close()
            runner.logger.removeHandler(handler)


def run_method(method, args, work_root):
    """One method's run (its config by ``args.config_pattern``; a
    ``…_bf16-graph`` method is its fast preset), as ``tools/test.py`` runs
    it (the config's own loader, precision and options): images/s after
    ``args.warmup``, the whole stream's images/s (from the loop's start,
    loader workers, warm-up and graph captures included), the run's
    seconds (its runner built too), classifier calls per image (None for
    a graph run: its replays call no hook), peak CUDA
    memory allocated (MB; None without CUDA), mIoU and the stage scores
    (:func:`stage_scores`)."""
    config = method_config(args.config_pattern, method)
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    runner = build_runner(config, args, osp.join(work_root, method), method)
    try:
        classifier = runner.model.get_submodule(
            head_layer_of(runner.cfg) or 'decode_head.conv_seg')
        timer = loop_timer()
        classifier.register_forward_hook(timer.count)
        runner.register_hook(timer)
        metrics = runner.test()
    finally:
        close_log_files(runner)
    n = len(timer.times)
    stream = timer.times[-1] - timer.start if n and timer.start else None
    # a replayed graph runs no Python hook: only its eager steps and its
    # capture would be counted
    graphed = runner.test_loop.graph_step is not None
    return dict(images=n,
                images_per_second=images_per_second(timer.times,
                                                    args.warmup),
                whole_images_per_second=n / stream if stream else None,
                seconds=time.perf_counter() - t0,
                classifier_calls_per_image=None if graphed else
                timer.calls / n,
                peak_allocated_mb=timer.peak / 2**20
                if torch.cuda.is_available() else None,
                mIoU=metrics.get('continual/mIoU_mean_over_stages'),
                stages=stage_scores(runner.work_dir))
