"""A method's whole adaptation step replayed as a CUDA graph, around the
method: ``method.adapt(batch, step=CUDAGraphStep(method))``.

A captured graph launches an eager step's thousands of kernels at once
(docs/running.md, "The fast preset"). The step must read nothing back to
the host and branch on no device value (a replay repeats the capture's):
the methods that can say so (``graph_capturable``); its optimizer keeps
its state on the device (Adam/AdamW ``capturable=True``); ``beta_t``
(eq:adaptive_decay) comes in a device tensor filled before each replay; a
graph is captured per input key (:func:`graph_key`), on a static copy of
the batch (:func:`static_batch`) whose inputs (:func:`graph_inputs`) later
batches are copied into.
"""
import dataclasses
from typing import Any, Dict, Hashable, List, Optional, Tuple

import torch

from ..stats import StepStats


@dataclasses.dataclass
class Captured:
    """One captured step: its graph, its inputs and its outputs."""
    graph: Any  # torch.cuda.CUDAGraph
    inputs: List[torch.Tensor]
    beta: Optional[torch.Tensor]
    prediction: Any  # Logits
    stats: StepStats


class CUDAGraphStep:
    """``method``'s step (``forward_and_adapt``), eager for the first
    batches of an input key, then as a captured CUDA graph.

    Built before ``method.configure`` (which builds the optimizer it makes
    capturable); a step is ``method.adapt(batch, step=this)``. Per key,
    the first ``warmup`` batches run eagerly on a side stream (real steps,
    which also create the optimizer's state that the graph then updates in
    place); the next batch is captured and replayed, every later one
    copied into the captured inputs and replayed: each batch is stepped on
    once, as in eager mode. The graphs share one memory pool;
    :meth:`reset` forgets them (the loop does at each stage's start), as
    does a rebuilt optimizer.

    Raises:
        ValueError: If the method's step cannot be captured, its optimizer
            is not Adam, AdamW or SGD, ``warmup < 1``, or it comes after
            ``configure`` built an optimizer it must make capturable; at
            the first step, if the model is not on a CUDA device or the
            method scales its gradients (fp16).
    """

    def __init__(self, method, warmup: int = 2):
        if not method.graph_capturable:
            raise ValueError(
                f'{method.name}: cuda_graph=True is for methods whose step '
                'reads nothing back to the host (TENT, BN Adapt, '
                'segmentation CoTTA with restore_on_device=True); this '
                "one's step as configured reads or branches on device "
                'values')
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
        self.stream = None
        self.pool = None

    def reset(self) -> None:
        """Forget every graph (a new stage; the optimizer was rebuilt or
        reloaded: its state tensors are new)."""
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
        if self.optimizer is not self.method.optimizer:
            if self.optimizer is None:
                self.check_method()
            self.reset()  # the graphs stepped the old optimizer
            self.optimizer = self.method.optimizer
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
        return copy_outputs(captured.prediction, captured.stats)

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
            prediction, stats = copy_outputs(prediction, stats)
        main.wait_stream(side)
        for value in (prediction.value, *stats.values()):
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
        with torch.cuda.graph(graph, pool=self.pool, stream=side):
            prediction, stats = self.method.forward_and_adapt(
                static, beta_buffer)
        torch.cuda.current_stream().wait_stream(side)
        self.pool = graph.pool()
        return Captured(graph, inputs, beta_buffer, prediction, stats)


#: the metainfo a segmentor's forward pass and its post-processing depend
#: on (``model.inference`` resizes by them): part of :func:`graph_key`
GRAPH_META_KEYS = ('img_shape', 'ori_shape', 'pad_shape', 'padding_size',
                   'flip', 'flip_direction')


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
    its inputs."""
    static = dataclasses.replace(batch, inputs=batch.inputs.clone())
    views = getattr(batch, 'views', None)
    if not views:
        return static
    return dataclasses.replace(static, views=[
        dataclasses.replace(view, inputs=static.inputs)
        if view.inputs is batch.inputs else static_batch(view)
        for view in views])


def copy_outputs(prediction, stats: StepStats) -> Tuple[Any, StepStats]:
    """The prediction (``Logits``/``Labels``) and the tensor statistics
    copied (on the device); post-processed data samples are not kept: a
    captured step's are those of the batch it was captured on."""
    return type(prediction)(prediction.value.clone()), stats.map(
        lambda v: v.clone() if torch.is_tensor(v) else v)


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
