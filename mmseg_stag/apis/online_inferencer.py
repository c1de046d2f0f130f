"""Adapt a segmentor online on frames without labels, one call a frame.

``OnlineInferencer`` drives the same :class:`OnlineAdaptationLoop` step
that ``tools/test.py`` runs on a benchmark (same method, statistics,
non-finite check, logging and visualizer backends), built by MMEngine's
``Runner`` from the config as ``tools/test.py`` builds it; only the stream
differs: the frames the caller gives, through the config's test pipeline
without its label loading::

    __call__(frames) / step(data, name)
      -> pipeline (file or decoded BGR array, no labels) -> collate
      -> loop.step: task.batch -> method.adapt -> task.outputs
         (``realtime``: the frames that come while a step runs predicted
         only, no update: docs/realtime.md)
      -> loop.log_stats (every frame: read, checked finite, logged)
      -> [reset to the source: every N frames, or on a non-finite value]
      -> SegDataSample (pred_sem_seg, seg_logits; a replayed CUDA graph
         hands out pred_sem_seg only)
"""
import copy
import os.path as osp
import uuid
from typing import Any, Dict, List, Optional, Sequence, Union

import numpy as np
import torch
from mmengine.config import Config
from mmengine.dataset import Compose
from mmengine.logging import print_log
from mmengine.runner import Runner

from mmseg_stag.checkpoint import load_model_checkpoint
from mmseg_stag.core import NonFiniteStatistic
from mmseg_stag.engine.online_loop import runner_model
from mmseg_stag.engine.online_task import head_layer_of
from mmseg_stag.engine.run_state import (RESUME_IGNORES, identity_differences,
                                         rng_state, set_rng_state)
from mmseg_stag.engine.runs import prepare_config
from mmseg_stag.engine.stream import StreamStage

#: what to do on a non-finite statistic: stop (the benchmark loop's), or
#: restart from the source weights and go on
ON_NONFINITE = ('stop', 'reset')
#: the adapted state a stream continues from (``state_dict``), this
#: version's layout
STATE_SCHEMA = 2

Frame = Union[str, np.ndarray]
#: where the label map is made: at the frame's size (MMSeg's, the default)
#: or at the network's input size (``'test'``: the logits are not resized
#: to the frame; the caller resizes the labels, nearest)
LABELS_AT = ('frame', 'test')


def check_device(device: Optional[str]) -> Optional[torch.device]:
    """``device`` as a ``torch.device`` (None: MMEngine's choice, CUDA
    where there is one); ``ValueError`` for an unknown one or a GPU that is
    not there."""
    if device is None:
        return None
    try:
        dev = torch.device(device)
    except RuntimeError:
        raise ValueError(f'device {device!r}: not a device (cpu, cuda, '
                         'cuda:N)') from None
    if dev.type == 'cuda':
        if not torch.cuda.is_available():
            raise ValueError(f'device {device!r}: this torch sees no CUDA '
                             'GPU (torch.cuda.is_available() is False)')
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ValueError(f'device {device!r}: there are '
                             f'{torch.cuda.device_count()} CUDA GPU(s)')
        torch.cuda.set_device(dev)
    elif dev.type != 'cpu':
        raise ValueError(f'device {device!r}: cpu or cuda[:N] only')
    return dev


def quiet_console(logger, cfg: Config) -> None:
    """The run's logger with its console at warnings and its file at
    everything: the environment and the config, which MMEngine's runner
    logged nowhere (its level was ``WARNING``), into the file."""
    import logging

    from mmengine.utils.dl_utils import collect_env
    for handler in logger.handlers:
        handler.setLevel(logging.INFO if isinstance(
            handler, logging.FileHandler) else logging.WARNING)
    env = '\n    '.join(f'{k}: {v}' for k, v in collect_env().items())
    logger.info(f'System environment:\n    {env}')
    logger.info(f'Config:\n{cfg.pretty_text}')


def check_online_config(cfg: Config, path: str) -> None:
    """A config that adapts: the online loop with a method (``ValueError``
    in one sentence otherwise)."""
    test_cfg = cfg.get('test_cfg') or {}
    if test_cfg.get('type') != 'OnlineAdaptationLoop' or not test_cfg.get(
            'method'):
        raise ValueError(
            f'{path} has no online method (test_cfg.type='
            'OnlineAdaptationLoop with test_cfg.method): use one of '
            'configs/stag_acdc/*.py, e.g. '
            'segformer_mit-b5-nvlabs_acdc-continual_tent-stag.py')
    if cfg.model.get('type') == 'OnlineClassifier':
        raise ValueError(f'{path} is a classification config; adapting on '
                         'your own frames is for segmentors '
                         '(docs/adapt.md says why)')


def frame_stream_config(cfg: Config) -> dict:
    """The config's test loader with the frames in place of its dataset:
    its test pipeline without labels, its classes and palette; no loader
    workers (the caller decodes)."""
    from mmseg.registry import DATASETS

    from mmseg_stag.segmentation.datasets import unlabeled_pipeline
    dataset = cfg.test_dataloader.dataset
    kind = DATASETS.get(dataset.get('type'))
    metainfo = dict(getattr(kind, 'METAINFO', {}) or {})
    metainfo.update(dataset.get('metainfo') or {})
    return dict(batch_size=1, num_workers=0, persistent_workers=False,
                # round_up: no padding of an empty stream (it divides by it)
                sampler=dict(type='DefaultSampler', shuffle=False,
                             round_up=False),
                dataset=dict(type='FrameStream', frames=[],
                             pipeline=unlabeled_pipeline(dataset.pipeline),
                             metainfo=metainfo))


def as_bgr(image: np.ndarray) -> np.ndarray:
    """A decoded frame as 3-channel BGR ``uint8``, as MMCV reads a file in
    colour: a grey frame repeated, an alpha channel dropped (``ValueError``
    for another shape or type)."""
    if image.dtype != np.uint8:
        raise ValueError(f'a frame must be uint8 (as OpenCV decodes), got '
                         f'{image.dtype}')
    if image.ndim == 2 or (image.ndim == 3 and image.shape[2] == 1):
        image = np.repeat(image.reshape(image.shape[:2] + (1, )), 3, axis=2)
    elif image.ndim == 3 and image.shape[2] == 4:
        image = np.ascontiguousarray(image[..., :3])
    if image.ndim != 3 or image.shape[2] != 3:
        raise ValueError('a frame must be H x W x 3 BGR (or grey, or with '
                         f'alpha), got shape {image.shape}')
    return image


def copied(value):
    """``value`` with every tensor copied to the CPU (dicts, lists and
    tuples walked)."""
    if torch.is_tensor(value):
        return value.detach().to('cpu', copy=True)
    if isinstance(value, dict):
        return type(value)((k, copied(v)) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return type(value)(copied(v) for v in value)
    return copy.deepcopy(value)


def realtime_config(realtime: Union[float, str, dict]) -> dict:
    """``realtime`` as ``test_cfg.realtime``: a step's cost in forwards (a
    number > 0, or ``'measure'``), or the option's whole dict (``cost``,
    ``warmup``, ``repeats``); the loop checks it."""
    return dict(realtime) if isinstance(realtime, dict) else dict(
        cost=realtime)


def frames_config(cfg: Config, config: str,
                  work_dir: Optional[str] = None,
                  realtime: Union[None, float, str, dict] = None) -> Config:
    """``cfg`` as the frames run it: the frame stream in place of the
    benchmark's data, no metric (no labels), no loop run state (the
    inferencer keeps its own), a work dir and randomness as
    ``tools/test.py`` sets them; ``realtime`` (:func:`realtime_config`)
    sets ``test_cfg.realtime``."""
    cfg.test_dataloader = frame_stream_config(cfg)
    cfg.test_evaluator = []
    cfg.test_cfg.save_state = False
    if realtime is not None:
        cfg.test_cfg.realtime = realtime_config(realtime)
    name = osp.splitext(osp.basename(config))[0]
    cfg = prepare_config(cfg, work_dir or osp.join('work_dirs', 'adapt',
                                                   name), config)
    cfg.experiment_name = f'adapt_{name}_{uuid.uuid4().hex[:8]}'
    return cfg


def resume_differences(config: str, checkpoint: str, state: dict,
                       work_dir: str, cfg_options: Optional[dict] = None,
                       trust_pickle: bool = False,
                       realtime: Union[None, float, str, dict] = None
                       ) -> List[str]:
    """What keeps ``state`` (:meth:`OnlineInferencer.state_dict`) from
    continuing with ``config`` and ``checkpoint`` (and ``realtime``), one
    line each, found without building a runner: nothing is written (a
    refused resume changes nothing in ``work_dir``)."""
    from mmseg_stag.engine.runs import starting_identity
    if state.get('schema') != STATE_SCHEMA:
        return [f'an adaptation state of schema {state.get("schema")}; this '
                f'version reads {STATE_SCHEMA}']
    cfg = Config.fromfile(config)
    if cfg_options:
        cfg.merge_from_dict(cfg_options)
    check_online_config(cfg, config)
    cfg = frames_config(cfg, config, work_dir, realtime)
    return identity_differences(
        state['identity'], starting_identity(cfg, checkpoint, trust_pickle),
        RESUME_IGNORES)


class OnlineInferencer:
    """A segmentor adapted online on the frames it is called on, by the
    config's method (Source, BN Adapt, TENT, CoTTA, EATA, SAR, DeYO,
    Hybrid-TTA, ± STAG, fast presets included), as ``tools/test.py``'s
    loop adapts on a benchmark. State carries over from call to call (a
    continual stream).

    Args:
        config (str): A config of the online loop (``configs/stag_acdc``).
        checkpoint (str): The source weights (or adapted ones, saved by
            :meth:`save_checkpoint`).
        work_dir (str, optional): The run's log and visualizer files.
            Default: ``work_dirs/adapt/<config name>``.
        cfg_options (dict, optional): Merged into the config.
        reset_every (int, optional): Restart from the source weights
            after every N frames. Default: None (never: continual).
        stage_frames (int, optional): Every N frames open a new stage, as
            a benchmark's condition does: what the method's
            ``stage_restart`` names restarts (``beta_t``, the optimizer's
            state, in place where it can: a CUDA graph survives it).
            Default: None (one stage; the ACDC protocol's is 400).
        on_nonfinite (str): ``'stop'`` (raise ``NonFiniteStatistic``,
            as the benchmark loop does) or ``'reset'`` (restart from the
            source weights and go on). Default: ``'stop'``.
        trust_pickle (bool): Read a legacy pickle checkpoint.
        device (str, optional): ``'cpu'``, ``'cuda'``, ``'cuda:N'``.
            Default: None (MMEngine's: CUDA where there is one).
        labels_at (str): ``'frame'`` (MMSeg's: the logits resized to the
            frame, then argmax) or ``'test'`` (argmax at the network's
            input size, the config's test scale; ``pred_sem_seg`` at that
            size, the frame's in ``metainfo['frame_shape']``). Refused for
            a method that adapts on full-size predictions (CoTTA,
            Hybrid-TTA). Default: ``'frame'``.
        quiet (bool): MMEngine's environment and config dump and the
            per-frame log lines in the log file only; the console shows
            warnings. Default: False.
        realtime (float, str or dict, optional): The realistic online
            protocol (docs/realtime.md), ``test_cfg.realtime``: a step
            costs this many forwards (``'measure'``: timed on the first
            frame), and the frames that come while it runs are predicted
            only, no update; a dict gives ``cost``, ``warmup``,
            ``repeats``. A frame's place in the schedule counts from its
            stage's first frame (``stage_frames``; else from the first
            frame). Default: None (every frame adapts).

    Raises:
        ValueError: If the config has no online method, ``reset_every``
            is below 1 or ``on_nonfinite`` unknown, or the checkpoint does
            not fit the config (classes, head), before any frame.
    """

    def __init__(self, config: str, checkpoint: str,
                 work_dir: Optional[str] = None,
                 cfg_options: Optional[dict] = None,
                 reset_every: Optional[int] = None,
                 stage_frames: Optional[int] = None,
                 on_nonfinite: str = 'stop', trust_pickle: bool = False,
                 device: Optional[str] = None, labels_at: str = 'frame',
                 quiet: bool = False,
                 realtime: Union[None, float, str, dict] = None):
        if labels_at not in LABELS_AT:
            raise ValueError(f'labels_at must be one of {LABELS_AT}, got '
                             f'{labels_at!r}')
        self.labels_at = labels_at
        self.device = check_device(device)
        for key, value in (('reset_every', reset_every),
                           ('stage_frames', stage_frames)):
            if value is not None and int(value) < 1:
                raise ValueError(f'{key} must be >= 1 or None, got {value}')
        if on_nonfinite not in ON_NONFINITE:
            raise ValueError(f'on_nonfinite must be one of {ON_NONFINITE}, '
                             f'got {on_nonfinite!r}')
        self.reset_every = None if reset_every is None else int(reset_every)
        self.stage_frames = None if stage_frames is None else int(
            stage_frames)
        self.on_nonfinite = on_nonfinite
        for path, what in ((config, 'config'), (checkpoint, 'checkpoint')):
            if not osp.isfile(path):
                raise FileNotFoundError(f'{what} file not found: {path}')
        cfg = Config.fromfile(config)
        if cfg_options:
            cfg.merge_from_dict(cfg_options)
        check_online_config(cfg, config)
        # the benchmark's pipeline and loader workers, before the frames
        # replace its dataset
        self.pipeline_cfg = list(cfg.test_dataloader.dataset.pipeline)
        #: the config's loader workers: how many processes decode frames
        self.workers = int(cfg.test_dataloader.get('num_workers', 0))
        self.cfg = frames_config(cfg, config, work_dir, realtime)
        self.config, self.checkpoint = config, checkpoint
        if quiet:  # MMEngine's environment and config dump: the file only
            self.cfg.log_level = 'WARNING'
        self.runner = Runner.from_cfg(self.cfg)
        if quiet:
            quiet_console(self.runner.logger, self.cfg)
        if self.device is not None:
            self.runner.model.to(self.device)
        load_model_checkpoint(self.model, checkpoint, trust_pickle,
                              head_layer_of(self.cfg))
        print_log(f'Loaded checkpoint {checkpoint}', logger='current')
        self.start()

    def start(self) -> None:
        """Build the loop, configure the method on the model (the loop's
        ``begin_stream``), open the first stage: what a stream does before its
        first frame."""
        runner = self.runner
        self.loop = runner.test_loop  # MMEngine builds it on first access
        dataset = self.loop.dataloader.dataset
        self.classes = dataset.metainfo.get('classes')
        self.palette = dataset.metainfo.get('palette')
        self.collate = self.loop.dataloader.collate_fn
        self.pipelines = {False: dataset.pipeline}
        for hook in ('before_run', 'before_test', 'before_test_epoch'):
            runner.call_hook(hook)
        _, _, self.identity, _ = self.loop.begin_stream(keep_source=True)
        if self.labels_at == 'test' and self.loop.method.needs_original_size:
            raise ValueError(
                f"labels_at='test': {self.loop.method.name} adapts on its "
                'predictions at the frame\'s own size (needs_original_size)'
                ", so they are made at that size anyway: use labels_at="
                "'frame'")
        # tools/test.py's loader draws its seed from torch's generator
        # before the first batch: the same draw, so that a method's random
        # numbers (CoTTA's restores) are those of the benchmark loop
        iter(self.loop.dataloader)
        # one continual stage (a benchmark's stage boundaries restart the
        # method's optimizer or beta_t only where its config asks)
        self.loop.start_stage(self.stage_of(0))
        #: frames stepped on, those adapted on (``realtime``: not the
        #: frames predicted only), restarts from the source, and why
        self.frames = self.adapted = 0
        self.resets: List[Dict[str, Any]] = []

    def stage_of(self, frame: int) -> StreamStage:
        """The stage of frame ``frame`` (``stage_frames`` a stage)."""
        if not self.stage_frames:
            return StreamStage(0, 1, 'frames', 0, 0)
        k = frame // self.stage_frames
        return StreamStage(k, 1, 'frames', k * self.stage_frames,
                           (k + 1) * self.stage_frames)

    @property
    def model(self):
        return runner_model(self.runner)

    @property
    def model_device(self) -> torch.device:
        """Where the model runs."""
        return next(self.model.parameters()).device

    def pipeline(self, from_array: bool) -> Compose:
        """The config's test pipeline without labels, for files or for
        decoded frames."""
        if from_array not in self.pipelines:
            from mmseg_stag.segmentation.datasets import unlabeled_pipeline
            self.pipelines[from_array] = Compose(
                unlabeled_pipeline(self.pipeline_cfg, from_array=True))
        return self.pipelines[from_array]

    def load_frame(self, frame: Frame, index: Optional[int] = None) -> dict:
        """One frame (a file, or a BGR ``uint8`` array ``H x W x 3``)
        through the pipeline: what :meth:`step` takes."""
        from mmseg_stag.segmentation.datasets.frame_stream import frame_info
        index = self.frames if index is None else index
        if isinstance(frame, np.ndarray):
            return self.pipeline(True)(frame_info(index,
                                                  image=as_bgr(frame)))
        return self.pipeline(False)(frame_info(index, str(frame)))

    def __call__(self, frames: Union[Frame, Sequence[Frame]]):
        """Adapt on ``frames`` in order (one frame or a list), a step each;
        return the ``SegDataSample`` of each (one for one frame)."""
        single = isinstance(frames, (str, np.ndarray))
        outputs = [self.step(self.load_frame(f))[0]
                   for f in ([frames] if single else frames)]
        return outputs[0] if single else outputs

    def step(self, data: dict, name: Optional[str] = None):
        """Predict, then adapt, on one loaded frame (:meth:`load_frame`):
        return its ``SegDataSample`` and its statistics as read (floats:
        ``loss``, ``loss_stag``, ``beta``, …; ``reset``: why the model
        was restarted from the source after this frame, else None; with
        ``realtime``, ``adapted``: False for a frame predicted only, which
        has no step statistics)."""
        index, resets = self.frames, len(self.resets)
        if self.stage_frames and index and index % self.stage_frames == 0:
            self.loop.start_stage(self.stage_of(index))
        data_batch = self.frame_batch(data, name)
        realtime = self.loop.realtime
        if realtime is not None and realtime.cost is None:
            self.loop.measure_cost(data_batch)  # the first frame, restored
        adapt = self.adapts(index)
        # the runner's hooks see each frame as the loop's batches
        self.runner.call_hook('before_test_iter', batch_idx=index,
                              data_batch=data_batch)
        try:
            (output, ) = self.loop.step(index, data_batch, adapt)
        except NonFiniteStatistic as err:  # a method that reads its loss
            if self.on_nonfinite == 'stop':
                raise
            # no prediction came out: the frame again, from the source
            self.restart_from_source(f'non-finite: {err}')
            (output, ) = self.loop.step(index, data_batch, adapt)
        self.frames += 1
        self.adapted += adapt
        stats = self.read_stats()
        if self.reset_every and self.frames % self.reset_every == 0 and \
                'nonfinite' not in stats:
            self.restart_from_source(f'every {self.reset_every} frames')
        stats['reset'] = '; '.join(r['why'] for r in self.resets[resets:]
                                   ) or None
        if realtime is not None:
            stats['adapted'] = adapt
        self.runner.call_hook('after_test_iter', batch_idx=index,
                              data_batch=data_batch, outputs=[output])
        return output, stats

    def frame_batch(self, data: dict, name: Optional[str] = None) -> dict:
        """One loaded frame as the loop's batch of one, named ``name``
        (what a message calls it), its size kept for ``labels_at``."""
        data_batch = self.collate([data])
        for sample in data_batch['data_samples']:
            if isinstance(sample, (list, tuple)):
                continue
            if name is not None:  # what a message names the frame by
                sample.set_metainfo(dict(img_path=name))
            if self.labels_at == 'test':
                # the prediction at the network's input size: MMSeg's
                # post-processing resizes to ori_shape, the frame's size
                # kept as frame_shape for the caller's label map
                sample.set_metainfo(dict(
                    frame_shape=tuple(sample.metainfo['ori_shape']),
                    ori_shape=tuple(sample.metainfo['img_shape'])))
        return data_batch

    def adapts(self, index: int) -> bool:
        """Whether frame ``index`` adapts: always, but where ``realtime``'s
        step of an earlier frame still runs (the frame's place counted
        from its stage's first frame, ``stage_frames``)."""
        realtime = self.loop.realtime
        if realtime is None:
            return True
        position = index % self.stage_frames if self.stage_frames else index
        return realtime.adapts(position)

    def read_stats(self) -> dict:
        """The statistics of the frame just stepped ({} for a frame
        predicted only: no step); a non-finite one raises
        (``on_nonfinite='stop'``) or restarts from the source, said in
        ``nonfinite``."""
        try:
            values = self.loop.log_stats()
        except NonFiniteStatistic as err:
            if self.on_nonfinite == 'stop':
                raise
            self.restart_from_source(f'non-finite: {err}')
            return dict(nonfinite=str(err))
        return dict(values[0]) if values else {}

    def realtime_record(self) -> Optional[dict]:
        """What the frames say of ``realtime``'s protocol, as the loop's
        results do (``cost``, ``how``, ``period``, ``batches_adapted``,
        ``batches_predicted_only`` of the frames so far, ``measured``);
        None without it."""
        realtime = self.loop.realtime
        if realtime is None:
            return None
        if realtime.cost is None:  # 'measure', before the first frame
            return dict(cost=None, how=realtime.how, period=None,
                        batches_adapted=0, batches_predicted_only=0,
                        measured=None)
        return realtime.record(self.adapted, self.frames)

    def restart_from_source(self, why: str = 'asked') -> None:
        """Restart from the source weights (and a fresh method: optimizer,
        ``t`` of ``beta_t``) before the next frame, logged."""
        self.resets.append(dict(before=self.frames, why=why))
        # the updates of the method the restart replaces, as the loop
        # counts them at a from-source stage
        self.loop.num_updates += self.loop.method.num_updates
        self.loop.restart_from_source(len(self.resets))
        self.loop.method.start_stage(self.stage_of(self.frames).index)
        print_log(f'restarted from the source weights before frame '
                  f'{self.frames}: {why}', logger='current')

    def state_dict(self) -> dict:
        """What the rest of the stream depends on: the method's state (the
        adapted tensors, optimizer, ``t``), the frames and restarts so
        far, the random states, ``realtime``'s cost (measured once) and
        frames adapted; and the run's identity (config, starting
        weights), which :meth:`load_state_dict` checks; tensors copied to
        the CPU."""
        loop = self.loop
        realtime = None if loop.realtime is None else dict(
            # a measured cost: the resumed stream keeps its schedule
            cost=loop.realtime.cost,
            measured=copy.deepcopy(loop.realtime.measured),
            adapted=int(self.adapted))
        # copies: the method's own tensors change with the next frame
        return dict(schema=STATE_SCHEMA, identity=self.identity,
                    frames=self.frames, resets=copy.deepcopy(self.resets),
                    method=copied(loop.method.state_dict()),
                    num_updates_before=int(loop.num_updates),
                    rng=rng_state(), realtime=realtime)

    def load_state_dict(self, state: dict) -> None:
        """Continue from :meth:`state_dict` of the same config and starting
        weights (``ValueError`` naming what differs otherwise)."""
        if state.get('schema') != STATE_SCHEMA:
            raise ValueError(f'an adaptation state of schema '
                             f'{state.get("schema")}; this version reads '
                             f'{STATE_SCHEMA}')
        diffs = identity_differences(state['identity'], self.identity,
                                     RESUME_IGNORES)
        if diffs:
            raise ValueError(
                'the saved adaptation state is of another run ('
                f'{len(diffs)} difference(s)):\n  ' + '\n  '.join(diffs))
        self.loop.method.load_state_dict(state['method'])
        self.loop.num_updates = int(state['num_updates_before'])
        self.frames, self.resets = int(state['frames']), list(
            state['resets'])
        saved, realtime = state.get('realtime'), self.loop.realtime
        self.adapted = self.frames if saved is None else int(
            saved['adapted'])
        if saved is not None and realtime is not None and \
                realtime.how == 'measured':
            # the cost measured on the stream's first frame, not again
            realtime.cost, realtime.measured = saved['cost'], copy.deepcopy(
                saved['measured'])
        set_rng_state(state['rng'])

    def save_checkpoint(self, path: str, meta: Optional[dict] = None
                        ) -> Optional[str]:
        """The adapted segmentor as a checkpoint (``{'state_dict',
        'meta'}``) that ``tools/test.py`` (with the method's config or the
        Source one), this class and MMSeg's ``MMSegInferencer`` read, and
        beside it the inference config ``MMSegInferencer`` needs,
        ``<path stem>.py`` (returned): BatchNorm layers on each frame's
        statistics keep the source's running statistics (named in
        ``meta['batch_statistics']``), added modules are recorded
        (``meta['added_modules']``, Hybrid-TTA's), and for a method that
        predicts with an EMA teacher (CoTTA, Hybrid-TTA) the weights are
        the student's (``meta['weights']``)."""
        return self.loop.save_adapted(path, dict(
            meta or {}, config=self.config, source=self.checkpoint,
            frames=self.frames))

    def close(self) -> None:
        """End the run: the hooks' ends (logs closed)."""
        self.runner.call_hook('after_test_epoch', metrics={})
        self.runner.call_hook('after_test')
        self.runner.call_hook('after_run')
        import logging
        for handler in list(self.runner.logger.handlers):
            if isinstance(handler, logging.FileHandler):
                handler.close()
                self.runner.logger.removeHandler(handler)
