"""MMEngine test loop that adapts the model online, for either task."""
import logging
import os
import os.path as osp
import time
from typing import List, Optional, Union

import torch
from mmengine.config import Config
from mmengine.dist import get_world_size
from mmengine.hooks import LoggerHook
from mmengine.logging import print_log
from mmengine.model import is_model_wrapper
from mmengine.registry import LOOPS
from mmengine.runner import TestLoop
from torch.utils.data import DataLoader

from mmseg_stag.checkpoint import adapted_checkpoint, bn_buffers
from mmseg_stag.core import NonFiniteStatistic
from mmseg_stag.core.methods.step_graph import CUDAGraphStep
from .determinism import configure_cuda_math, configure_determinism
from .launch_guard import check_single_process
from .online_task import build_task
from .provenance import run_provenance
from .realtime import measure_cost, realtime_options, snapshot, stage_positions
from .report import write_torch
from .run_state import (STATE_FILE, check_stateful, load_run_state,
                        resume_state, rng_state, run_identity, save_run_state,
                        set_rng_state, stage_end_state)
from .speed_options import MIXED_PRECISION, speed_options
from .step_stats import Pending, PendingStep, StatsRead, log_step_stats
from .stream import StreamSchedule, StreamStage, dataset_stages
from .stream_metric import assign_result_files


def check_moved(bn_batch_stats: Optional[bool]) -> None:
    """``ValueError`` for a loop option that is now the method's."""
    if bn_batch_stats is not None:
        raise ValueError(
            "test_cfg.bn_batch_stats is now the method's option: write "
            'test_cfg.method.bn_batch_stats=True (one place for BatchNorm '
            'statistics; BN Adapt has them always)')


def check_source_data(method, source_dataloader) -> None:
    """``ValueError`` when the method needs clean source images and
    ``test_cfg.source_dataloader`` is not set, or the other way round (an
    option nothing would read)."""
    if method.needs_source_data and source_dataloader is None:
        raise ValueError(
            f'{method.name} needs clean source images before the '
            'stream (e.g. EATA\'s Fisher information): set '
            'test_cfg.source_dataloader (see configs/_base_/datasets/'
            'cityscapes_source.py, configs/cls/_base_/methods/eata.py), '
            'or configure the method without it (EATA: fisher_alpha=0)')
    if not method.needs_source_data and source_dataloader is not None:
        raise ValueError(
            f'{method.name}, as configured, takes no clean source '
            'images (EATA takes them for its Fisher information, with '
            'fisher_alpha > 0), so nothing reads '
            'test_cfg.source_dataloader: remove it '
            '(test_cfg.source_dataloader=None)')


def runner_model(runner):
    """The runner's model out of its wrapper (MMEngine's DDP wrappers):
    the one unwrapping every part of the package uses."""
    model = runner.model
    return model.module if is_model_wrapper(model) else model


@LOOPS.register_module()
class OnlineAdaptationLoop(TestLoop):
    """Test loop that predicts each batch, then adapts the model on it.

    Args:
        dataloader (DataLoader | dict): The stream, in order; its dataset
            declares the stages (``stream_stages()``, else one stage).
        method (dict): Config of a ``mmseg_stag.core.METHODS`` method, e.g.
            ``dict(type='tent', stag=dict(beta0=500, gamma=35))``.
        head_layer (str, optional): Module name of the classifier in the
            adapted module. Default: the task's.
        task (str, optional): ``'segmentation'`` or ``'classification'``.
            Default: the model's.
        bn_batch_stats: Refused: BatchNorm's test-batch statistics are the
            method's option, ``method=dict(..., bn_batch_stats=True)``.
        fp16 (bool): MMEngine's flag; refused when True: float16 autocast
            has one name here, ``mixed_precision='fp16'``.
        main_view (int, optional): The view a multi-view segmentation
            pipeline adapts on and scores. Default: the pipeline's.
        source_dataloader (DataLoader | dict, optional): Clean source images
            for a method that needs them (EATA's Fisher); refused for a
            method that does not. Default: None.
        save_state (bool): Whether to save the run state at every stage
            end. Default: True.
        resume (bool): Whether to continue from the saved run state.
        mixed_precision (str, optional): ``'bf16'`` or ``'fp16'`` autocast
            of the forward passes. Default: None (float32).
        tf32 (bool, optional): Whether float32 matmuls and cuDNN
            convolutions may use TF32. Default: None (PyTorch's settings).
        cuda_graph (bool): Replay the method's step as a CUDA graph
            (:class:`~mmseg_stag.core.methods.step_graph.CUDAGraphStep`),
            captured again whenever the optimizer is another object or
            its state was loaded (a stage restart zeroes it in place where
            it can, keeping the graph). Default: False.
        graph_warmup (int, optional): Eager steps per input shape before a
            capture; refused without ``cuda_graph``. Default: None (2).
        preset (str, optional): The named preset a fast config is
            (``speed_options.PRESETS``): its run stops before the stream
            without a CUDA device, and its log and results name it.
            Default: None.
        realtime (dict, optional): The realistic online protocol
            (:mod:`~mmseg_stag.engine.realtime`, docs/realtime.md):
            ``dict(cost=C)``, a step costs C forwards and the batches that
            arrive meanwhile are predicted without an update;
            ``dict(cost='measure')`` times C on the first batch. Default:
            None (every batch adapts).

    Raises:
        RuntimeError: If launched on more than one rank.
        ValueError: If an option contradicts the model, method or device.
        FileNotFoundError: If ``resume`` finds no run state.
    """

    def __init__(self,
                 runner,
                 dataloader,
                 evaluator: Union[dict, list],
                 method: dict,
                 head_layer: Optional[str] = None,
                 task: Optional[str] = None,
                 bn_batch_stats: Optional[bool] = None,
                 fp16: bool = False,
                 main_view: Optional[int] = None,
                 source_dataloader: Optional[Union[dict, object]] = None,
                 save_state: bool = True,
                 resume: bool = False,
                 mixed_precision: Optional[str] = None,
                 tf32: Optional[bool] = None,
                 cuda_graph: bool = False,
                 graph_warmup: Optional[int] = None,
                 preset: Optional[str] = None,
                 realtime: Optional[dict] = None):
        check_single_process(get_world_size())
        check_moved(bn_batch_stats)
        self.method_cfg = dict(method)
        options = {} if main_view is None else dict(main_view=main_view)
        self.task = build_task(runner_model(runner), task, head_layer,
                               **options)
        # bad options fail here, the wrong task at configure (run's start)
        self.method = self.task.build_method(self.method_cfg)
        check_source_data(self.method, source_dataloader)
        device_type = next(runner_model(runner).parameters()).device.type
        self.device_type = device_type
        self.speed = speed_options(device_type, mixed_precision, tf32,
                                   cuda_graph, graph_warmup, preset, fp16)
        self.speed.check_method(self.method)
        self.realtime = realtime_options(realtime, self.speed.cuda_graph)
        #: the step a CUDA graph replays (None: eager), before configure
        self.graph_step = self.graph_step_of(self.method)
        self.setup_precision()
        #: the steps' statistics not read yet, and the reads started but
        #: not logged yet, oldest first (log_stats)
        self.pending_stats: Pending = []
        self.reads: List[StatsRead] = []
        super().__init__(runner, dataloader, evaluator, fp16=False)
        self.task.check_dataset(self.dataloader.dataset)
        self.task.setup(self.dataloader.dataset)
        self.save_state, self.resume = bool(save_state), bool(resume)
        if self.resume and not osp.isfile(self.state_path):
            raise FileNotFoundError(
                f'--resume: no previous run in {self.runner.work_dir} (no '
                f'{STATE_FILE}); run without --resume to start it')
        self.source_dataloader = self.source_statistics = None
        if self.method.needs_source_data:  # a missing folder fails here
            self.source_dataloader = runner.build_dataloader(
                source_dataloader, seed=runner.seed)
        self.schedule = StreamSchedule(
            dataset_stages(self.dataloader.dataset),
            self.dataloader.batch_sampler)
        #: each batch's position in its stage: when the realistic
        #: protocol's steps run (realtime)
        self.positions = stage_positions(
            [p.stage.index for p in self.schedule.positions])

    def graph_step_of(self, method) -> Optional[CUDAGraphStep]:
        """The CUDA-graph step of a method just built (``cuda_graph``),
        made before its ``configure``; None: eager steps."""
        if not self.speed.cuda_graph:
            return None
        return CUDAGraphStep(method, warmup=self.speed.graph_warmup)

    @property
    def state_path(self) -> str:
        return osp.join(self.runner.work_dir, STATE_FILE)

    def run(self) -> dict:
        """Configure the method (or resume), run the stream, return the
        evaluator's metrics."""
        self.runner.call_hook('before_test')
        self.runner.call_hook('before_test_epoch')
        start, rng, identity, stateful = self.begin_stream()
        started = time.perf_counter()
        batches = iter(self.batches_from(start))
        if rng is not None:  # after the loader drew its seed, as at start
            set_rng_state(rng)
        for idx, data_batch in enumerate(batches, start):
            if self.realtime is not None and self.realtime.cost is None:
                self.measure_cost(data_batch)  # on the first, restored
            position = self.schedule[idx]
            if position.starts:
                self.start_stage(position.stage)
            self.run_iter(idx, data_batch)
            if position.ends:
                self.end_stage(idx + 1, identity, stateful)
        return self.finish(start, time.perf_counter() - started)

    def begin_stream(self, keep_source: bool = False):
        """Configure the method on the model (or resume): what a stream
        needs before its first batch. Return the first batch, the random
        states a resume sets, the run's identity and whether its state can
        be saved. ``keep_source``: keep the source weights to restart from
        (:meth:`restart_from_source`) even where no stage does."""
        configure_cuda_math(self.speed.tf32)
        configure_determinism()  # warn-only list + one log line
        model = runner_model(self.runner)
        model.eval()
        # the weights before adapting
        identity = run_identity(self.runner.cfg.to_dict(), model)
        adapted = self.task.adapted_module(model)
        self.source_state = None
        #: the BatchNorm statistics before the method: what an adapted
        #: checkpoint's layers on batch statistics keep (adapted_checkpoint)
        self.source_buffers = bn_buffers(model)
        self.task.configure(self.method, adapted)
        for metric in self.evaluator.metrics:
            if getattr(metric, 'output_dir', False) is None:
                metric.output_dir = self.runner.work_dir
        assign_result_files(self.evaluator.metrics)  # one writer per file
        if self.schedule.restarts_from_source or keep_source:
            # after configure: a method that adds modules (Hybrid-TTA) has
            # them, at their initialisation, in the state a stage restarts
            # from (and does not add them again)
            self.source_state = {k: v.detach().clone()
                                 for k, v in adapted.state_dict().items()}
        stateful = check_stateful(self.evaluator.metrics, self.save_state,
                                  self.resume)
        #: the updates of the methods that earlier from-source stages
        #: replaced (the current method counts its own)
        self.num_updates = 0
        start, rng = 0, None
        if self.resume:
            start, self.num_updates, rng = resume_state(
                self.state_path, identity, len(self.dataloader), self.method,
                self.evaluator.metrics)
            if self.realtime is not None and self.realtime.cost is None:
                # the schedule of the run resumed: its measured cost
                saved = load_run_state(self.state_path)['realtime']
                self.realtime.cost = saved['cost']
                self.realtime.measured = saved['measured']
        elif self.source_dataloader is not None and not (
                self.schedule[0].stage.from_source):
            self.fit_source()
        num = sum(p.numel() for _, p in self.method.params)
        print_log(f'online adaptation ({self.task.name}): {self.method!r}; '
                  f'{len(self.method.params)} trainable tensors ({num} '
                  'values)' + self.speed.describe() + (
                      '' if self.realtime is None else
                      self.realtime.describe()), logger='current')
        return start, rng, identity, stateful

    def finish(self, start: int, seconds: float) -> dict:
        """Log the stream's rate, give the metrics the run's provenance,
        evaluate them; ``start``: the first batch run, ``seconds``: since
        then."""
        if self.device_type == 'cuda':  # the queued steps are part of it
            torch.cuda.synchronize()
        images = len(self.dataloader.dataset) - self.images_before(start)
        num_updates = self.num_updates + self.method.num_updates
        # the whole loop (loader, steps, metric), as a benchmark times it
        print_log(f'online adaptation: {num_updates} update steps; '
                  f'{images} images in {seconds:.1f} s '
                  f'({images / max(seconds, 1e-9):.2f} images/s, loader, '
                  'steps and metric)', logger='current')
        device = next(runner_model(self.runner).parameters()).device
        speed = dict(mixed_precision=self.speed.mixed_precision,
                     preset=self.speed.preset,
                     cuda_graph=self.speed.cuda_graph, tf32=self.speed.tf32)
        # what the numbers came from, written with them
        provenance = run_provenance(
            self.runner.cfg, device, self.method_cfg, speed, self.runner.seed,
            seconds, images, start if self.resume else None)
        info = dict(num_updates=num_updates, provenance=provenance)
        if self.realtime is not None:
            info['realtime'] = self.realtime.record(
                sum(map(self.adapts, range(len(self.schedule)))),
                len(self.schedule))
        for metric in self.evaluator.metrics:
            if hasattr(metric, 'run_info'):
                metric.run_info.update(info)
        metrics = self.evaluator.evaluate(len(self.dataloader.dataset))
        self.runner.call_hook('after_test_epoch', metrics=metrics)
        self.runner.call_hook('after_test')
        return metrics

    def start_stage(self, stage: StreamStage) -> None:
        """Open ``stage``: restart from the source if set, tell the others."""
        if stage.from_source:
            self.num_updates += self.method.num_updates
            self.restart_from_source(stage.index)
        # what else restarts is the method's (stage_restart); a graph
        # captures again when its optimizer is new (CUDAGraphStep)
        self.method.start_stage(stage.index)
        for metric in self.evaluator.metrics:
            if hasattr(metric, 'start_stage'):
                metric.start_stage(stage)

    def restart_from_source(self, index: int) -> None:
        """Restart from the source weights and a fresh method."""
        torch.manual_seed(int(self.runner.seed or 0) * 100003 + int(index))
        adapted = self.task.adapted_module(runner_model(self.runner))
        adapted.load_state_dict(self.source_state)
        self.method = self.task.build_method(self.method_cfg)
        self.graph_step = self.graph_step_of(self.method)
        self.setup_precision()
        self.task.configure(self.method, adapted)
        if self.source_dataloader is not None:
            self.fit_source()

    def adapted_checkpoint(self, meta: Optional[dict] = None) -> dict:
        """The adapted model as a checkpoint its config's model loads
        strictly (:func:`~mmseg_stag.checkpoint.adapted_checkpoint`), the
        method named in its ``meta`` (and which weights they are, for a
        method that predicts with an EMA teacher: CoTTA's, Hybrid-TTA's)."""
        meta = dict(meta or {}, method=self.method.name)
        if getattr(self.method, 'teacher', None) is not None:
            meta.update(weights='student', note=(
                f'{self.method.name} predicts with its EMA teacher, which '
                'is not saved: these are the weights of the student'))
        return adapted_checkpoint(runner_model(self.runner),
                                  getattr(self, 'source_buffers', None), meta)

    def save_adapted(self, path: str, meta: Optional[dict] = None
                     ) -> Optional[str]:
        """Write :meth:`adapted_checkpoint` to ``path`` (atomically, the
        stream's classes and palette in its ``meta['dataset_meta']``) and,
        where the task has one (a segmentor), the inference config MMSeg's
        ``MMSegInferencer`` reads beside it, ``<path stem>.py``; return
        that config's path (None: none written).

        Raises:
            ValueError: If ``path`` ends in ``.py`` (the config's name).
        """
        stem, ext = osp.splitext(path)
        if ext == '.py':
            raise ValueError(f'{path}: name the adapted checkpoint .pth; '
                             'its inference config is <name>.py beside it')
        meta = dict(meta or {})
        metainfo = getattr(self.dataloader.dataset, 'metainfo', None) or {}
        if metainfo.get('classes') is not None:
            meta['dataset_meta'] = dict(classes=metainfo.get('classes'),
                                        palette=metainfo.get('palette'))
        checkpoint = self.adapted_checkpoint(meta)
        try:
            config = self.task.inference_config(
                self.runner.cfg, checkpoint['meta'], path)
        except ValueError as err:  # the checkpoint all the same
            print_log(f'no inference config beside {path}: {err}',
                      logger='current', level=logging.WARNING)
            config = None
        if config is not None:
            checkpoint['meta']['inference_config'] = osp.basename(
                stem) + '.py'
        write_torch(path, checkpoint)
        if config is None:
            return None
        write_text_atomic(stem + '.py', (
            f'# MMSegInferencer(model={osp.basename(stem)}.py, weights='
            f'{osp.basename(path)}): the adapted checkpoint as MMSeg reads '
            'it (mmseg_stag, docs/adapt.md)\n') + Config(config).pretty_text)
        return stem + '.py'

    def end_stage(self, batches_done: int, identity: dict,
                  stateful: bool) -> None:
        """Log the steps' statistics, close the stage, save the state."""
        self.log_stats()  # a non-finite statistic stops before the writes
        visualizer = self.runner.visualizer
        for metric in self.evaluator.metrics:
            if hasattr(metric, 'end_stage'):
                result = metric.end_stage()
                if result is None:  # no image of the stage reached it
                    continue
                # the stage's score to the visualizer's backends
                # (TensorBoard, W&B, LocalVisBackend's scalars.json)
                for tag, (value, step) in metric.stage_scalars(
                        result).items():
                    visualizer.add_scalar(tag, value, step=step)
        if stateful and self.save_state:
            state = stage_end_state(
                identity, batches_done, len(self.dataloader), self.method,
                self.num_updates, self.evaluator.metrics)
            if self.realtime is not None:  # a measured cost, resumed
                state['realtime'] = dict(cost=self.realtime.cost,
                                         measured=self.realtime.measured)
            save_run_state(self.state_path, state)

    def batches_from(self, start: int):
        """Return a loader of the batches from ``start`` on, skipping loads."""
        loader = self.dataloader
        if start == 0:
            return loader
        batches: List[list] = list(loader.batch_sampler)[start:]
        extra = dict(prefetch_factor=loader.prefetch_factor,
                     persistent_workers=loader.persistent_workers) \
            if loader.num_workers > 0 else {}
        return DataLoader(loader.dataset, batch_sampler=batches,
                          num_workers=loader.num_workers,
                          collate_fn=loader.collate_fn,
                          pin_memory=loader.pin_memory,
                          worker_init_fn=loader.worker_init_fn, **extra)

    def fit_source(self) -> None:
        """Fit the method's statistics on the clean source images."""
        if self.source_statistics is not None:
            # a restart from the source: the same weights, statistics
            self.method.load_source_statistics(self.source_statistics)
            return
        print_log(f'{self.method.name}: statistics of '
                  f'{len(self.source_dataloader.dataset)} clean source '
                  'images', logger='current')
        self.task.fit_source(self.method, self.task.source_batches(
            runner_model(self.runner), self.source_dataloader))
        self.source_statistics = self.method.source_statistics()

    def run_iter(self, idx: int, data_batch: dict) -> None:
        """Predict, then adapt, on batch ``idx`` of the stream."""
        self.runner.call_hook(
            'before_test_iter', batch_idx=idx, data_batch=data_batch)
        outputs = self.step(idx, data_batch, self.adapts(idx))
        self.evaluator.process(data_samples=outputs, data_batch=data_batch)
        if (idx + 1) % self.log_interval == 0:  # a stage's end: end_stage
            self.log_stats(wait=False)
        self.runner.call_hook(
            'after_test_iter', batch_idx=idx, data_batch=data_batch,
            outputs=outputs)

    def adapts(self, idx: int) -> bool:
        """Whether batch ``idx`` adapts: always, but where the realistic
        protocol's step of an earlier batch still runs."""
        return self.realtime is None or self.realtime.adapts(
            self.positions[idx])

    def step(self, idx: int, data_batch: dict, adapt: bool = True) -> list:
        """Predict, then adapt, on ``data_batch`` (batch ``idx``): return
        the task's outputs (segmentation: ``SegDataSample``s with
        ``pred_sem_seg``); its statistics wait for :meth:`log_stats`.
        ``adapt=False``: predict with the current weights alone (the
        realistic protocol's batch that arrives during a step)."""
        batch = self.task.batch(runner_model(self.runner), data_batch)
        if not adapt:
            return self.marked(self.task.outputs(
                batch, self.predict_only(batch)), False)
        # autocast wraps the forward passes only (TaskAdapter.autocast_dtype)
        images = image_names(data_batch)
        try:
            with torch.set_grad_enabled(self.method.has_loss):
                # the graph replays forward_and_adapt; None: eager
                prediction, stats = self.method.adapt(
                    batch, replay=self.graph_step)
        except NonFiniteStatistic as err:  # a method that reads its loss
            raise err.locate(idx, self.method.name, images) from None
        self.pending_stats.append(PendingStep(idx, stats, images))
        outputs = self.task.outputs(batch, prediction)
        return outputs if self.realtime is None else self.marked(outputs,
                                                                 True)

    @staticmethod
    def marked(outputs: list, adapted: bool) -> list:
        """``outputs`` with whether they adapted (``metainfo['adapted']``:
        the metrics' per-image records say it)."""
        for sample in outputs:
            sample.set_metainfo(dict(adapted=adapted))
        return outputs

    def predict_only(self, batch):
        """The prediction of a forward of the method's model as it is,
        no update: the authors' ``model.model(images)`` for a batch that
        arrives during a step (Alfarra et al.; for a mean-teacher method
        its student, as theirs)."""
        with torch.no_grad():
            fwd = self.method.task_adapter.forward(self.method.model, batch)
        return self.method.prediction(fwd)

    def measure_cost(self, data_batch: dict) -> None:
        """``realtime.cost='measure'``: time the step and the forward on
        ``data_batch``, then restore the model, the method and the random
        states, so that the run is the run of the cost it records."""
        model = runner_model(self.runner)
        adapted = self.task.adapted_module(model)
        saved = snapshot((adapted.state_dict(), self.method.state_dict(),
                          rng_state()))
        batch = self.task.batch(model, data_batch)

        def step():
            with torch.set_grad_enabled(self.method.has_loss):
                self.method.adapt(batch)

        measure_cost(self.realtime, step, lambda: self.predict_only(batch),
                     next(model.parameters()).device)
        adapted.load_state_dict(saved[0])
        self.method.load_state_dict(saved[1])
        set_rng_state(saved[2])
        print_log('online adaptation: realtime: measured' +
                  self.realtime.describe(), logger='current')

    def log_stats(self, wait: bool = True) -> List[dict]:
        """Read, check and log the steps' statistics since the last read
        (not every step: reading waits for the device) and return them, a
        dict of floats a step; a non-finite one stops the run
        (:class:`NonFiniteStatistic`), the pending steps dropped.

        ``wait=False`` (the logger's interval): start reading the pending
        steps (:class:`~.step_stats.StatsRead`: on a GPU a copy to pinned
        memory) and log the reads that have arrived, without waiting for
        the GPU: a stream waits only at its stages' ends (``wait=True``),
        where every read is logged."""
        if self.pending_stats:
            self.reads.append(StatsRead(self.pending_stats))
            self.pending_stats = []
        logged = []
        while self.reads and (wait or self.reads[0].ready()):
            read = self.reads.pop(0)
            try:
                values = log_step_stats(read, self.runner.message_hub,
                                        self.method.name)
            except NonFiniteStatistic:
                self.reads.clear()  # the later steps adapted on it
                raise
            # each step's statistics to the visualizer's backends, by batch
            for step, step_values in zip(read.pending, values):
                self.runner.visualizer.add_scalars(
                    {f'test/{k}': v for k, v in step_values.items()},
                    step=step.batch + 1)
            logged.extend(values)
        return logged

    def images_before(self, start: int) -> int:
        """The images of the first ``start`` batches (a resumed run's)."""
        if start == 0:
            return 0
        return sum(len(b) for b in list(self.dataloader.batch_sampler)[
            :start])

    @property
    def log_interval(self) -> int:
        """The ``LoggerHook`` interval (1 without a logger hook)."""
        for hook in self.runner.hooks:
            if isinstance(hook, LoggerHook):
                return max(int(hook.interval), 1)
        return 1

    def setup_precision(self) -> None:
        """Autocast the task's forward passes; give fp16 a gradient
        scaler."""
        precision = self.speed.mixed_precision
        if precision is None:
            return
        self.task.task_adapter.autocast_dtype = MIXED_PRECISION[precision]
        if precision == 'fp16' and self.method.has_loss:
            # fp16 gradients underflow (TENT's full-size CE: ~1/2M a pixel)
            self.method.use_grad_scaler(self.device_type)


def write_text_atomic(path: str, text: str) -> None:
    """Write ``text`` to ``path``; a crash leaves the old file or the new."""
    tmp = f'{path}.tmp{os.getpid()}'
    with open(tmp, 'w', encoding='utf-8') as f:
        f.write(text)
    os.replace(tmp, path)


def image_names(data_batch: dict) -> list:
    """The batch's images as a message names them: their paths, else the
    tags a classification stream gives them (its corruption)."""
    samples = data_batch.get('data_samples') or []
    if samples and isinstance(samples[0], (list, tuple)):  # views
        samples = samples[0]
    names = []
    for sample in samples:
        meta = getattr(sample, 'metainfo', {})
        name = meta.get('img_path') or meta.get('corruption')
        names.append(str(name) if name is not None else '?')
    return names
