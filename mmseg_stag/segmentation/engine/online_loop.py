"""``OnlineAdaptationLoop``: MMSeg's test loop that adapts the model online."""
import contextlib
import functools
import os.path as osp
from typing import List, Optional, Sequence, Union

import torch
from mmengine.dist import get_world_size
from mmengine.logging import print_log
from mmengine.model import is_model_wrapper
from mmengine.runner import TestLoop
from mmengine.structures import PixelData
from mmseg.registry import LOOPS
from torch.utils.data import DataLoader

from mmseg_stag.core import BatchContext, HeadProbe, View, build_method
from mmseg_stag.core.run_state import (flatten_settings, load_run_state,
                                       rng_state, save_run_state,
                                       set_rng_state, settings_differences,
                                       weights_fingerprint)

#: ``mixed_precision`` values: the autocast dtype of the forward passes
MIXED_PRECISION = {'bf16': torch.bfloat16, 'fp16': torch.float16}
#: the run state a resumable stream saves at every stage boundary
STATE_FILE = 'online_adaptation_state.pth'
#: config keys that do not change a run's numbers (a resumed run may change
#: them): where it writes, how it loads and logs
RESUME_IGNORES = ('work_dir', 'launcher', 'experiment_name',
                  'test_cfg.resume', 'test_cfg.save_state', '*num_workers',
                  '*persistent_workers', 'default_hooks.*', 'visualizer.*',
                  'vis_backends*', 'log_processor.*', 'log_level',
                  'env_cfg.*')

#: The message of the distributed guard: the unit of parallel work is a
#: whole run, which tools/sweep.py spreads over GPUs and nodes with Ray.
DISTRIBUTED_ERROR = (
    'OnlineAdaptationLoop: a continual stream is sequential (every image is '
    'predicted by the model adapted on all images before it), so it cannot '
    'be split across {n} ranks: each rank would adapt on only 1 of every {n} '
    'images and the metric would see a different stream. Run one stream '
    'with --launcher none; to use several GPUs or nodes, run whole streams '
    'in parallel (configs x checkpoints x seeds x beta0/gamma) with '
    'tools/sweep.py, one GPU per run, on Ray (see the README, "Many runs on '
    'many GPUs").')


@LOOPS.register_module()
class OnlineAdaptationLoop(TestLoop):
    """Test loop that predicts each batch, then adapts the model on it.

    It owns every batch; hooks only observe. One batch::

        run_iter(data_batch)
         ├─ model.data_preprocessor(data_batch) -> inputs, data_samples
         ├─ method.on_stage(stage of the batch)
         ├─ method.adapt(BatchContext(inputs, forward))  [grad if it updates]
         │   ├─ forward(model, inputs): HeadProbe around model.inference
         │   │    -> seg_logits, [(features, logits) at the head's size]
         │   ├─ method.loss(ctx) = L_base + beta_t * L_STAG
         │   │    (labels at the original size: postprocess_result, once)
         │   └─ backward, optimizer step     (prediction made before it)
         ├─ model.postprocess_result(seg_logits, data_samples)  [or reused]
         ├─ evaluator.process(outputs)       (per-image areas, per stage)
         └─ message_hub: test/loss, test/loss_stag, test/beta, ...

    Args:
        runner (Runner): the runner.
        dataloader (DataLoader | dict): the stream (batch size 1 as in
            CoTTA's protocol, no shuffle).
        evaluator (Evaluator | dict | list): e.g. ``ContinualIoUMetric``.
        method (dict): an online-adaptation method, e.g.
            ``dict(type='tent', stag=dict(beta0=500, gamma=35))``
            (``mmseg_stag.core.METHODS``).
        classifier (str): module name of the decode head's 1x1 classifier.
            Default: ``'decode_head.conv_seg'`` (every MMSeg decode head).
        fp16 (bool): MMEngine's ``TestLoop`` flag, the same as
            ``mixed_precision='fp16'``. Default: False.
        mixed_precision (str, optional): ``'bf16'`` or ``'fp16'``: each
            batch's forward passes (and the method's loss) under
            ``torch.autocast`` with that dtype; the STAG term stays in
            float32 and the parameters and optimizer in float32. bf16 is
            the one to use: fp16 has no loss scaling here, so very small
            gradients can underflow. Default: None (float32).
        main_view (int, optional): with a multi-view pipeline
            (``ScaleFlipViews`` or MMCV's ``TestTimeAug``, for CoTTA's
            teacher): the view the model adapts on and the metric scores,
            unflipped. Default: ``ScaleFlipViews.main_view`` of the
            pipeline, else 0.
        source_dataloader (DataLoader | dict, optional): clean source
            images for a method that needs them before the stream (EATA's
            Fisher information), e.g. Cityscapes val; their labels are not
            used. Required by such a method, unused by the others.
        save_state (bool): at every stage boundary (and at the end) save
            the run state to ``<work_dir>/online_adaptation_state.pth``,
            atomically: the method's state (model, optimizer, teacher, ...),
            the metric's per-image areas, the random states, the position
            in the stream and the run's fingerprint. Default: True.
        resume (bool): continue from that file: refused if it was written
            by another config (keys of ``RESUME_IGNORES`` aside) or other
            starting weights. ``tools/test.py --resume`` sets it.
            Default: False.
    """

    def __init__(self,
                 runner,
                 dataloader,
                 evaluator: Union[dict, list],
                 method: dict,
                 classifier: str = 'decode_head.conv_seg',
                 fp16: bool = False,
                 main_view: Optional[int] = None,
                 source_dataloader: Optional[Union[dict, object]] = None,
                 save_state: bool = True,
                 resume: bool = False,
                 mixed_precision: Optional[str] = None):
        if get_world_size() > 1:
            raise RuntimeError(DISTRIBUTED_ERROR.format(n=get_world_size()))
        self.method = build_method(method)  # bad options fail here
        self.method.check_output('per_pixel')
        self.probe = HeadProbe(classifier, output='per_pixel')
        self.probe.find(self._model(runner))  # no such 1x1 conv: fail now
        if main_view is not None and (int(main_view) != main_view
                                      or main_view < 0):
            raise ValueError(f'main_view must be an index >= 0, got '
                             f'{main_view!r}')
        if self.method.needs_source_data and source_dataloader is None:
            raise ValueError(
                f'{self.method.name} needs clean source images before the '
                'stream (e.g. EATA\'s Fisher information): set '
                'test_cfg.source_dataloader (see configs/_base_/datasets/'
                'cityscapes_source.py), or configure the method without it '
                '(EATA: fisher_alpha=0)')
        if mixed_precision not in (None, *MIXED_PRECISION):
            raise ValueError(f'mixed_precision must be one of '
                             f'{sorted(MIXED_PRECISION)} or None, got '
                             f'{mixed_precision!r}')
        if fp16 and mixed_precision not in (None, 'fp16'):
            raise ValueError(f'fp16=True contradicts mixed_precision='
                             f'{mixed_precision!r}')
        self.mixed_precision = 'fp16' if fp16 else mixed_precision
        super().__init__(runner, dataloader, evaluator, fp16=False)
        self.main_view = pipeline_main_view(self.dataloader.dataset) \
            if main_view is None else int(main_view)
        self.save_state, self.resume = bool(save_state), bool(resume)
        if self.resume and not osp.isfile(self.state_path):
            raise FileNotFoundError(
                f'--resume: no previous run in {self.runner.work_dir} (no '
                f'{STATE_FILE}); run without --resume to start it')
        self.source_dataloader = None
        if self.method.needs_source_data:  # a missing folder fails here
            self.source_dataloader = runner.build_dataloader(
                source_dataloader, seed=runner.seed)

    @staticmethod
    def _model(runner):
        model = runner.model
        return model.module if is_model_wrapper(model) else model

    @property
    def state_path(self) -> str:
        return osp.join(self.runner.work_dir, STATE_FILE)

    def run(self) -> dict:
        """Configure the method on the loaded model (or resume), then run
        the stream, saving the run state at every stage boundary."""
        self.runner.call_hook('before_test')
        self.runner.call_hook('before_test_epoch')
        model = self._model(self.runner)
        model.eval()
        identity = self.run_identity(model)  # the weights before adapting
        self.method.configure(model, self.probe.classifier(model),
                              'per_pixel')
        for metric in self.evaluator.metrics:
            if getattr(metric, 'output_dir', False) is None:
                metric.output_dir = self.runner.work_dir
        stateful = self.check_stateful()
        start, stage, rng = 0, None, None
        if self.resume:
            start, stage, rng = self.load_state(identity)
        elif self.source_dataloader is not None:
            self.fit_source(model)
        num = sum(p.numel() for _, p in self.method.params)
        print_log(f'online adaptation: {self.method!r}; '
                  f'{len(self.method.params)} trainable tensors ({num} '
                  'values)', logger='current')
        batches = iter(self.batches_from(start))
        if rng is not None:  # after the loader drew its seed, as at start
            set_rng_state(rng)
        for idx, data_batch in enumerate(batches, start):
            batch = batch_stage(batch_metas(data_batch))
            if stateful and idx > start and batch != stage:
                self.end_stage(idx, identity)
            stage = batch
            self.run_iter(idx, data_batch)
        if stateful:
            self.end_stage(len(self.dataloader), identity)
        print_log(f'online adaptation: {self.method.num_updates} update '
                  'steps', logger='current')
        metrics = self.evaluator.evaluate(len(self.dataloader.dataset))
        self.runner.call_hook('after_test_epoch', metrics=metrics)
        self.runner.call_hook('after_test')
        return metrics

    # -- resume ----------------------------------------------------------
    def run_identity(self, model) -> dict:
        """What determines the run's numbers: the config's settings (as
        flat ``key: value`` strings) and the starting weights."""
        settings = flatten_settings(self.runner.cfg.to_dict())
        return dict(config=settings, weights=weights_fingerprint(model))

    def check_stateful(self) -> bool:
        """Whether the run state can be saved (every metric has
        ``state_dict``); ``resume`` without it is an error."""
        if not (self.save_state or self.resume):
            return False
        lacking = [type(m).__name__ for m in self.evaluator.metrics
                   if not hasattr(m, 'state_dict')]
        if lacking and self.resume:
            raise ValueError(f'cannot resume: the metric(s) {lacking} keep '
                             'no state_dict (ContinualIoUMetric does)')
        if lacking:
            print_log(f'run state not saved: the metric(s) {lacking} keep no '
                      'state_dict, so this run cannot be resumed',
                      logger='current', level=30)
        return not lacking

    def end_stage(self, batches_done: int, identity: dict) -> None:
        """Close the stage in the metrics and save the run state."""
        for metric in self.evaluator.metrics:
            if hasattr(metric, 'end_stage'):
                metric.end_stage()
        if not self.save_state:
            return
        save_run_state(self.state_path, dict(
            identity=identity, batches_done=int(batches_done),
            num_batches=len(self.dataloader),
            method=self.method.state_dict(),
            metrics=[m.state_dict() for m in self.evaluator.metrics],
            rng=rng_state()))

    def load_state(self, identity: dict):
        """Restore the run state; returns ``(batches done, their last
        stage, the random states to set once the batches are drawn)``.
        Refuses a state of another run, naming what differs."""
        path = self.state_path
        state = load_run_state(path)
        diffs = settings_differences(state['identity']['config'],
                                     identity['config'], RESUME_IGNORES)
        if state['identity']['weights'] != identity['weights']:
            diffs.append('the starting weights (checkpoint): '
                         f"{state['identity']['weights'][:12]} -> "
                         f"{identity['weights'][:12]}")
        if diffs:
            raise ValueError(
                f'cannot resume from {path}: it was written by another run '
                f'({len(diffs)} difference(s)):\n  ' + '\n  '.join(diffs)
                + '\nUse the same config and checkpoint, or another '
                '--work-dir for a new run.')
        if state['num_batches'] != len(self.dataloader):
            raise ValueError(f'cannot resume from {path}: it holds a stream '
                             f"of {state['num_batches']} batches, this one "
                             f'has {len(self.dataloader)}')
        if len(state['metrics']) != len(self.evaluator.metrics):
            raise ValueError(f'cannot resume from {path}: '
                             f"{len(state['metrics'])} metric state(s) for "
                             f'{len(self.evaluator.metrics)} metric(s)')
        self.method.load_state_dict(state['method'])
        for metric, metric_state in zip(self.evaluator.metrics,
                                        state['metrics']):
            metric.load_state_dict(metric_state)
        done = state['batches_done']
        print_log(f'resumed from {path}: {done} of {len(self.dataloader)} '
                  f'batches done (stage {self.method.stage})',
                  logger='current')
        return done, self.method.stage, state['rng']

    def batches_from(self, start: int):
        """The stream's batches from batch ``start`` on (the skipped ones
        are not loaded)."""
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

    def fit_source(self, model) -> None:
        """The method's statistics of the clean source images."""
        def inputs():
            for batch in self.source_dataloader:
                with torch.no_grad():
                    yield model.data_preprocessor(batch, False)['inputs']

        def forward(m, x):  # whole-image metainfo, as the images come
            shape = tuple(x.shape[-2:])
            metas = [dict(img_shape=shape, ori_shape=shape, pad_shape=shape,
                          padding_size=[0, 0, 0, 0])] * len(x)
            return self.probe(m, x, run=lambda m_, x_: m_.inference(x_,
                                                                    metas))

        print_log(f'{self.method.name}: statistics of '
                  f'{len(self.source_dataloader.dataset)} clean source '
                  'images', logger='current')
        self.method.fit_source(forward, inputs())

    def probe_forward(self, metas):
        """``forward(model, inputs)``: the probe around ``model.inference``
        with this batch's (or view's) metainfo."""
        return functools.partial(
            self.probe, run=lambda m, x: m.inference(x, metas))

    def view(self, model, view_batch: dict) -> View:
        """One view of a multi-view batch, preprocessed."""
        with torch.no_grad():
            data = model.data_preprocessor(view_batch, False)
        samples = data['data_samples']
        post = Postprocess(model, samples)

        def to_original_size(seg_logits):
            return torch.stack([s.seg_logits.data for s in post(seg_logits)])

        return View(data['inputs'],
                    self.probe_forward([s.metainfo for s in samples]),
                    to_original_size)

    def run_iter(self, idx: int, data_batch: dict) -> None:
        """Predict, then adapt, on one batch (see the class docstring)."""
        self.runner.call_hook(
            'before_test_iter', batch_idx=idx, data_batch=data_batch)
        model = self._model(self.runner)
        views = split_views(data_batch)
        if self.main_view >= len(views):
            raise ValueError(f'main_view={self.main_view}, but the pipeline '
                             f'gives {len(views)} view(s) per image')
        with torch.no_grad():
            data = model.data_preprocessor(views[self.main_view], False)
        inputs, data_samples = data['inputs'], data['data_samples']
        metas = [s.metainfo for s in data_samples]
        if len(views) > 1 and any(m.get('flip') for m in metas):
            raise ValueError(f'main_view={self.main_view} is a flipped view; '
                             'choose the unflipped one at scale 1')
        self.method.on_stage(batch_stage(metas))
        postprocess = Postprocess(model, data_samples)
        ctx = BatchContext(
            inputs, self.probe_forward(metas),
            labels_at_original_size=postprocess.labels,
            views=[self.view(model, v) for v in views]
            if len(views) > 1 else None, main_view=self.main_view)
        with torch.set_grad_enabled(self.method.updates), \
                self.autocast(inputs):
            prediction, stats = self.method.adapt(ctx)
        if prediction.is_floating_point():  # logits at the input size
            outputs = postprocess(prediction)
        else:  # labels at the original size (CoTTA's evaluated label map)
            outputs = set_labels(data_samples, prediction)
        self.evaluator.process(data_samples=outputs, data_batch=data_batch)
        for key, value in stats.items():
            self.runner.message_hub.update_scalar(f'test/{key}', value)
        self.runner.call_hook(
            'after_test_iter', batch_idx=idx, data_batch=data_batch,
            outputs=outputs)


    def autocast(self, inputs):
        """``torch.autocast`` on the inputs' device, if configured."""
        if self.mixed_precision is None:
            return contextlib.nullcontext()
        device = inputs.device.type if torch.is_tensor(inputs) else 'cuda' \
            if torch.cuda.is_available() else 'cpu'
        return torch.autocast(device_type=device,
                              dtype=MIXED_PRECISION[self.mixed_precision])


class Postprocess:
    """``model.postprocess_result`` of one batch, computed once per
    prediction: the loss (labels at the original size) and the metric share
    it."""

    def __init__(self, model, data_samples):
        self.model, self.data_samples = model, data_samples
        self.done = self.outputs = None

    @torch.no_grad()
    def __call__(self, seg_logits: torch.Tensor) -> list:
        # the same storage and version: the same prediction (``done`` keeps
        # the tensor alive, so its memory cannot serve another tensor)
        key = (seg_logits.data_ptr(), tuple(seg_logits.shape),
               seg_logits._version)
        if self.done is None or key != self.done[0]:
            self.outputs = self.model.postprocess_result(
                seg_logits.detach(), self.data_samples)
            self.done = (key, seg_logits)
        return self.outputs

    def labels(self, seg_logits: torch.Tensor) -> torch.Tensor:
        """``[N, H0, W0]`` predicted labels at the original image size."""
        labels = [s.pred_sem_seg.data[0] for s in self(seg_logits)]
        shapes = {tuple(label.shape) for label in labels}
        if len(shapes) > 1:
            raise ValueError('labels at the original size need images of '
                             f'one size per batch, got {sorted(shapes)}')
        return torch.stack(labels)


def pipeline_main_view(dataset) -> int:
    """``main_view`` of the dataset's ``ScaleFlipViews`` (0 without)."""
    transforms = getattr(getattr(dataset, 'pipeline', None), 'transforms', [])
    for transform in transforms:
        if hasattr(transform, 'main_view'):
            return transform.main_view
    return 0


def split_views(data_batch: dict) -> list:
    """``[data_batch]``, or one batch per view of a multi-view pipeline
    (``TestTimeAug`` collates ``inputs`` as a list of views, each a list of
    images)."""
    inputs = data_batch['inputs']
    if not (isinstance(inputs, (list, tuple)) and inputs
            and isinstance(inputs[0], (list, tuple))):
        return [data_batch]
    return [dict(inputs=inputs[i], data_samples=data_batch['data_samples'][i])
            for i in range(len(inputs))]


def set_labels(data_samples: list, labels: torch.Tensor) -> list:
    """``pred_sem_seg`` of each sample from labels ``[N, H0, W0]`` at the
    original size."""
    for sample, label in zip(data_samples, labels):
        shape = tuple(sample.metainfo['ori_shape'])
        if tuple(label.shape) != shape:
            raise ValueError(f'a label prediction of shape {tuple(label.shape)}'
                             f' for an image of original size {shape}')
        sample.set_data(dict(pred_sem_seg=PixelData(data=label[None])))
    return data_samples


def batch_metas(data_batch: dict) -> List[dict]:
    """The metainfo of a (multi-view) batch's images, first view."""
    return [sample.metainfo
            for sample in split_views(data_batch)[0]['data_samples']]


def batch_stage(metas: Sequence[dict]) -> Optional[int]:
    """The stage tag shared by a batch's images (``None`` untagged)."""
    stages = {meta.get('stage') for meta in metas}
    if len(stages) > 1:
        raise ValueError(f'a batch spans several stages {sorted(stages)}; '
                         'use batch size 1 or stage-aligned batches')
    return stages.pop() if stages else None
