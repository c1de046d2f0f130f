"""A method's whole adaptation step replayed as a CUDA graph, around the
method: ``method.adapt(batch, replay=CUDAGraphStep(method))``.

A captured graph launches an eager step's thousands of kernels at once
(docs/running.md, "The fast preset"). The step must read nothing back to
the host and branch on no device value (a replay repeats the capture's):
the methods that can say so (``graph_capturable``), and no option that
reads the device (``stag.check_finite``); its optimizer keeps its state
on the device (Adam/AdamW ``capturable=True``); ``beta_t``
(eq:adaptive_decay) comes in a device tensor filled before each replay; a
graph is captured per input key (:func:`graph_key`), on a static copy of
the batch (:func:`static_batch`) whose inputs (:func:`graph_inputs`) later
batches are copied into.

Safe with the loader's worker processes and its pin-memory thread: a
capture is ``thread_local`` (another thread's CUDA calls, the pinned host
allocations of ``pin_memory=True``, are no error, pytorch#146924), and
each graph has its own memory pool, freed with it.
"""
import copy
import dataclasses
from typing import Any, Dict, Hashable, List, Optional, Tuple

import torch

from ..task_adapter import StepStats

#: what MMSeg's ``postprocess_result`` sets on each data sample; a
#: captured step whose loss post-processed (TENT's full-size loss) has
#: them among its outputs
POSTPROCESS_FIELDS = ('seg_logits', 'pred_sem_seg')
#: those a replay copies to the replayed batch's samples: the labels the
#: metric and the hooks read; not the full-size logits, which nothing
#: downstream reads and would cost a copy of C x H x W floats a replay
#: (158 MB for 19 classes at 1920 x 1080)
REPLAY_FIELDS = ('pred_sem_seg', )


@dataclasses.dataclass
class Captured:
    """One captured step: its graph, its inputs and its outputs (``post``:
    per image the post-processed tensors, :func:`postprocessed_tensors`)."""
    graph: Any  # torch.cuda.CUDAGraph
    inputs: List[torch.Tensor]
    beta: Optional[torch.Tensor]
    prediction: Any  # Logits
    stats: StepStats
    post: Optional[List[Dict[str, torch.Tensor]]] = None


class CUDAGraphStep:
    """``method``'s step (``forward_and_adapt``), eager for the first
    batches of an input key, then as a captured CUDA graph.

    Built before ``method.configure`` (which builds the optimizer it makes
    capturable); a step is ``method.adapt(batch, replay=this)``. Per key,
    the first ``warmup`` batches run eagerly on a side stream (real steps,
    which also create the optimizer's state that the graph then updates in
    place); the next batch is captured and replayed, every later one
    copied into the captured inputs and replayed: each batch is stepped on
    once, as in eager mode. Each graph has its own memory pool (graphs of
    two keys replay in any order, so none may reuse another's memory);
    :meth:`reset` forgets them, and their pools with them, when the
    method's optimizer or its state is another object (``stage_restart``
    rebuilt it, ``load_state_dict`` loaded one): the only changes a replay
    cannot follow.

    Raises:
        ValueError: If the method's step cannot be captured, it has an
            option that reads the device inside the step
            (``stag.check_finite=True``), its optimizer is not Adam, AdamW
            or SGD, ``warmup < 1``, or it comes after ``configure`` built
            an optimizer it must make capturable; at the first step, if
            the model is not on a CUDA device or the method scales its
            gradients (fp16).
    """

    def __init__(self, method, warmup: int = 2):
        if not method.graph_capturable:
            raise ValueError(
                f'{method.name}: cuda_graph=True is for methods whose step '
                'reads nothing back to the host (TENT, BN Adapt, '
                'segmentation CoTTA with restore_on_device=True); this '
                "one's step as configured reads or branches on device "
                'values')
        stag_loss = getattr(method, 'stag_loss', None)
        if stag_loss is not None and stag_loss.check_finite:
            # a host read inside the step: a capture cannot wait on it, and
            # the loop checks every statistic it reads anyway
            raise ValueError(
                f'{method.name}: stag.check_finite=True reads the device '
                'inside the step, which cuda_graph=True cannot capture; '
                'remove it (the loop checks loss_stag with every logged '
                'statistic) or set test_cfg.cuda_graph=False')
        if warmup < 1:
            raise ValueError(f'cuda_graph warmup must be >= 1 (the '
                             "optimizer's state is made by an eager step), "
                             f'got {warmup}')
        capturable = check_capturable_optimizer(method.optimizer_cfg)
        if method.model is not None and capturable != method.optimizer_cfg:
            raise ValueError(f'{method.name}: build CUDAGraphStep before '
                             'configure (it makes the optimizer capturable)')
        method.optimizer_cfg = capturable
        self.method = method
        self.warmup = int(warmup)
        self.graphs: Dict[Hashable, Captured] = {}
        self.eager_steps: Dict[Hashable, int] = {}
        self.optimizer = None  # the one the graphs update
        self.optimizer_state = None  # its ``state``, which a load replaces
        self.checked = False  # check_method ran (at the first step)
        self.stream = None

    def clear(self) -> None:
        """Forget every graph and its memory pool (a new stage; the
        optimizer was rebuilt or reloaded: its state tensors are new)."""
        self.graphs.clear()
        self.eager_steps.clear()

    def check_method(self) -> None:
        """At the first step: the configured method can be replayed."""
        method = self.method
        devices = {p.device.type for p in method.model.parameters()}
        if devices != {'cuda'}:
            raise ValueError(f'{method.name}: cuda_graph=True needs the '
                             'model on a CUDA device, its parameters are '
                             f'on {sorted(devices)}')
        if method.grad_scaler is not None:
            raise ValueError(f'{method.name}: cuda_graph=True replays no '
                             'GradScaler (float16); use bfloat16 or float32')

    def __call__(self, batch, beta: Optional[float]
                 ) -> Tuple[Any, StepStats]:
        if not self.checked:
            self.check_method()
            self.checked = True
        # None: a step without an update (BN Adapt without STAG)
        optimizer = self.method.optimizer
        state = None if optimizer is None else optimizer.state
        # a new optimizer or a loaded state (load_state_dict replaces
        # ``state``): the graphs stepped the old tensors
        if self.optimizer is not optimizer or self.optimizer_state is not \
                state:
            self.clear()
            self.optimizer, self.optimizer_state = optimizer, state
        key = graph_key(batch)
        captured = self.graphs.get(key)
        if captured is None:
            if self.eager_steps.get(key, 0) < self.warmup:
                self.eager_steps[key] = self.eager_steps.get(key, 0) + 1
                return self.eager(batch, beta)
            captured = self.graphs[key] = self.capture(batch, beta)
        for static, given in zip(captured.inputs, graph_inputs(batch)):
            static.copy_(given)
        if captured.beta is not None:
            captured.beta.fill_(beta)
        captured.graph.replay()
        # the next replay overwrites the graph's outputs; the loop reads
        # the statistics batches later
        # post-processed in the graph (``post``): the task does not again
        return copy_outputs(captured.prediction, captured.stats, None if
                            captured.post is None else attach_postprocessed(
                                captured.post, batch.data_samples))

    def side_stream(self):
        if self.stream is None:
            self.stream = torch.cuda.Stream()
        return self.stream

    def eager(self, batch, beta):
        """One eager step on the capture's stream (its lazily made cuBLAS
        workspaces and optimizer state ready before the capture)."""
        main, side = torch.cuda.current_stream(), self.side_stream()
        side.wait_stream(main)
        with torch.cuda.stream(side):
            prediction, stats = self.method.forward_and_adapt(batch, beta)
            # the batch's own samples, post-processed by the eager step
            prediction, stats = copy_outputs(
                prediction, stats, getattr(prediction, 'postprocessed', None))
        main.wait_stream(side)
        post = [v for tensors in postprocessed_tensors(prediction) or ()
                for v in tensors.values()]
        for value in (prediction.value, *stats.values(), *post):
            if torch.is_tensor(value) and value.is_cuda:
                # made on the side stream, used on the main one
                value.record_stream(main)
        return prediction, stats

    def capture(self, batch, beta) -> Captured:
        """Capture one step on a static copy of ``batch`` (nothing runs)."""
        static = static_batch(batch)
        inputs = graph_inputs(static)
        beta_buffer = None if beta is None else torch.full(
            (), float(beta), device=inputs[0].device)
        # the graph's backward then writes (not adds) the gradients
        self.method.zero_grad()
        graph = torch.cuda.CUDAGraph()
        side = self.side_stream()
        side.wait_stream(torch.cuda.current_stream())
        # its own pool (pool=None); thread_local: the loader's pin-memory
        # thread allocates pinned host memory meanwhile, which the default
        # 'global' mode turns into an error in the capture
        with torch.cuda.graph(graph, stream=side,
                              capture_error_mode='thread_local'):
            prediction, stats = self.method.forward_and_adapt(
                static, beta_buffer)
        torch.cuda.current_stream().wait_stream(side)
        return Captured(graph, inputs, beta_buffer, prediction, stats,
                        postprocessed_tensors(prediction))


#: the metainfo a segmentor's forward pass and its post-processing depend
#: on (``model.inference`` resizes by them; MMSeg's ``postprocess_result``
#: crops by ``img_padding_size`` where a sample has it, else by
#: ``padding_size``): part of :func:`graph_key`
GRAPH_META_KEYS = ('img_shape', 'ori_shape', 'pad_shape', 'padding_size',
                   'img_padding_size', 'flip', 'flip_direction')


def graph_key(batch) -> Hashable:
    """What a step captured as a CUDA graph was made for besides its input
    values: the inputs' shape, dtype and device; a segmentation batch's
    per-image sizes and flips, and its views' keys (CoTTA's teacher)."""
    inputs = batch.inputs
    if not torch.is_tensor(inputs):
        raise ValueError('cuda_graph=True needs a batch whose inputs are '
                         f'one tensor, got {type(inputs).__name__}')
    key = (tuple(inputs.shape), inputs.dtype, inputs.device)
    metas = getattr(batch, 'metas', None)
    if metas:
        key += (tuple(tuple(repr(meta.get(k)) for k in GRAPH_META_KEYS)
                      for meta in metas), )
    samples = getattr(batch, 'data_samples', None) or ()
    if any(hasattr(s, 'metainfo') for s in samples):
        # what the post-processing reads (the samples' metainfo, which may
        # hold more than ``metas``)
        key += (tuple(tuple(repr(s.metainfo.get(k)) for k in GRAPH_META_KEYS)
                      for s in samples), )
    views = getattr(batch, 'views', None)
    if views:
        key += (tuple(graph_key(view) for view in views), batch.main_view)
    return key


def graph_inputs(batch) -> List[torch.Tensor]:
    """The tensors of ``batch`` a captured step reads, copied into the
    graph's own (:func:`static_batch`'s) before each replay: the inputs
    and every view's (the main view's are the batch's own, listed once)."""
    views = getattr(batch, 'views', None) or ()
    return [batch.inputs] + [view.inputs for view in views
                             if view.inputs is not batch.inputs]


def static_batch(batch):
    """``batch`` with each of :func:`graph_inputs` cloned: the batch a step
    is captured on; the main view shares the batch's clone, as it shares
    its inputs. Its data samples are copies: a capture's post-processing
    writes into them, and the batch's own get the replay's outputs."""
    samples = batch.data_samples
    if samples:
        samples = [s.clone() if hasattr(s, 'clone') else copy.copy(s)
                   for s in samples]
    static = dataclasses.replace(batch, inputs=batch.inputs.clone(),
                                 data_samples=samples)
    views = getattr(batch, 'views', None)
    if not views:
        return static
    return dataclasses.replace(static, views=[
        dataclasses.replace(view, inputs=static.inputs)
        if view.inputs is batch.inputs else static_batch(view)
        for view in views])


def copy_outputs(prediction, stats: StepStats,
                 postprocessed: Optional[list] = None
                 ) -> Tuple[Any, StepStats]:
    """The prediction (``Logits``/``Labels``) and the tensor statistics
    copied (on the device), the prediction's post-processed data samples
    replaced by ``postprocessed``, the stepped batch's own (a captured
    step's are those of the batch it was captured on)."""
    value = prediction.value.clone()
    copied = type(prediction)(value) if postprocessed is None else \
        type(prediction)(value, postprocessed)
    return copied, stats.map(lambda v: v.clone() if torch.is_tensor(v)
                             else v)


def postprocessed_tensors(prediction
                          ) -> Optional[List[Dict[str, torch.Tensor]]]:
    """Per image, the tensors of :data:`POSTPROCESS_FIELDS` that the step's
    loss post-processed (a graph's outputs, rewritten by each replay);
    None where the step post-processed nothing."""
    samples = getattr(prediction, 'postprocessed', None)
    if samples is None:
        return None
    return [{k: s.get(k).data for k in POSTPROCESS_FIELDS if k in s}
            for s in samples]


def attach_postprocessed(post: List[Dict[str, torch.Tensor]],
                         data_samples: list) -> list:
    """``data_samples`` with copies of a replay's post-processed tensors
    of :data:`REPLAY_FIELDS` (:func:`postprocessed_tensors`) set as
    MMSeg's ``postprocess_result`` sets them: the labels the task would
    have made of the same logits (not the logits)."""
    from mmengine.structures import PixelData
    if len(post) != len(data_samples):
        raise ValueError(f'a replay post-processed {len(post)} images, the '
                         f'batch has {len(data_samples)}')
    for sample, tensors in zip(data_samples, post):
        sample.set_data({k: PixelData(data=v.clone())
                         for k, v in tensors.items() if k in REPLAY_FIELDS})
    return data_samples


def check_capturable_optimizer(optimizer_cfg: dict) -> dict:
    """``optimizer_cfg`` as a graph can replay it: Adam/AdamW with
    ``capturable=True`` (same update; its step count on the device), SGD
    as it is; ``ValueError`` for another or ``capturable=False``."""
    kind = optimizer_cfg.get('type')
    name = kind if isinstance(kind, str) else getattr(kind, '__name__', '')
    if name in ('Adam', 'AdamW'):
        if optimizer_cfg.get('capturable') is False:
            raise ValueError(f'cuda_graph=True needs {name}(capturable=True);'
                             ' the config sets capturable=False')
        return dict(optimizer_cfg, capturable=True)
    if name == 'SGD':
        return dict(optimizer_cfg)
    raise ValueError(f'cuda_graph=True supports the optimizers Adam, AdamW '
                     f'and SGD, got {kind!r}')
