"""A method's whole adaptation step replayed as a CUDA graph.

A captured graph launches an eager step's thousands of kernels at once
(docs/running.md, ``cuda_graph``). The step must read nothing back to the
host and branch on no device value (a replay repeats the capture's); its
optimizer keeps its state on the device (Adam/AdamW ``capturable=True``);
``beta_t`` (eq:adaptive_decay) comes in a device tensor filled before each
replay; a graph is captured per input key (``TaskAdapter.graph_key``), on
a static copy of the batch whose ``graph_inputs`` later batches are copied
into.
"""
import dataclasses
from typing import Any, Callable, Dict, Hashable, List, Optional, Tuple

import torch

from ..stats import StepStats

#: (batch, beta) -> (prediction, stats): the method's step
Step = Callable[[Any, Any], Tuple[Any, StepStats]]


@dataclasses.dataclass
class Captured:
    """One captured step: its graph, its inputs and its outputs."""
    graph: Any  # torch.cuda.CUDAGraph
    inputs: List[torch.Tensor]
    beta: Optional[torch.Tensor]
    prediction: Any  # Logits
    stats: StepStats


class StepGraphs:
    """Run ``step`` eagerly for the first batches of an input key, then as
    a captured CUDA graph.

    Per key, the first ``warmup`` batches run eagerly on a side stream
    (real steps, which also create the optimizer's state that the graph
    then updates in place); the next batch is captured and replayed, every
    later one copied into the captured inputs and replayed: each batch is
    stepped on once, as in eager mode. The graphs share one memory pool.

    ``step(batch, beta) -> (prediction, stats)``, beta a float or a 0-d
    device tensor (None without STAG); ``adapter`` gives ``static_batch``
    and ``graph_inputs``; ``zero_grad`` sets the adapted parameters'
    gradients to None before a capture, so that the graph's backward
    writes (not adds) them.
    """

    def __init__(self, step: Step, adapter, warmup: int = 2,
                 zero_grad: Optional[Callable[[], None]] = None):
        if warmup < 1:
            raise ValueError(f'cuda_graph warmup must be >= 1 (the '
                             "optimizer's state is made by an eager step), "
                             f'got {warmup}')
        self.step = step
        self.warmup = int(warmup)
        self.zero_grad = zero_grad or (lambda: None)
        self.static_batch = adapter.static_batch
        self.graph_inputs = adapter.graph_inputs
        self.graphs: Dict[Hashable, Captured] = {}
        self.eager_steps: Dict[Hashable, int] = {}
        self.stream = None
        self.pool = None

    def reset(self) -> None:
        """Forget every graph (the optimizer was rebuilt or reloaded: its
        state tensors are new)."""
        self.graphs.clear()
        self.eager_steps.clear()

    def __call__(self, batch, key: Hashable,
                 beta: Optional[float]) -> Tuple[Any, dict]:
        captured = self.graphs.get(key)
        if captured is None:
            if self.eager_steps.get(key, 0) < self.warmup:
                self.eager_steps[key] = self.eager_steps.get(key, 0) + 1
                return self.eager(batch, beta)
            captured = self.graphs[key] = self.capture(batch, beta)
        for static, given in zip(captured.inputs, self.graph_inputs(batch)):
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
            prediction, stats = self.step(batch, beta)
            prediction, stats = copy_outputs(prediction, stats)
        main.wait_stream(side)
        for value in (prediction.value, *stats.values()):
            if torch.is_tensor(value) and value.is_cuda:
                # made on the side stream, used on the main one
                value.record_stream(main)
        return prediction, stats

    def capture(self, batch, beta) -> Captured:
        """Capture one step on a static copy of ``batch`` (nothing runs)."""
        static = self.static_batch(batch)
        inputs = self.graph_inputs(static)
        beta_buffer = None if beta is None else torch.full(
            (), float(beta), device=inputs[0].device)
        self.zero_grad()
        graph = torch.cuda.CUDAGraph()
        side = self.side_stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.graph(graph, pool=self.pool, stream=side):
            prediction, stats = self.step(static, beta_buffer)
        torch.cuda.current_stream().wait_stream(side)
        self.pool = graph.pool()
        return Captured(graph, inputs, beta_buffer, prediction, stats)


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
