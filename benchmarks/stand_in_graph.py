"""A CUDA graph on the CPU: what ``CUDAGraphStep`` does around a capture
and a replay, checked where no GPU is (the tests, ``tools/gpu_check.py
--first-contact --allow-cpu``).

At capture the step's Python runs with its effects undone (a real capture
runs no kernel); each replay runs it again on the captured inputs and
writes the captured outputs in place, as a real replay writes the same
memory. What it cannot show is what only a GPU does: the kernels a capture
records, its memory pools, the streams' order."""
import copy
from contextlib import contextmanager

import torch

from mmseg_stag.core.methods.step_graph import (Captured, CUDAGraphStep,
                                                graph_inputs,
                                                postprocessed_tensors,
                                                static_batch)


class StandInGraph:
    """One captured step: ``run`` is the step on the captured inputs,
    ``outputs`` the captured ``(prediction, stats, post)`` it writes."""

    def __init__(self, run, outputs):
        self.run, self.outputs, self.replays = run, outputs, 0

    def pool(self):
        return 'pool'

    def replay(self):
        self.replays += 1
        prediction, stats = self.run()
        self.outputs[0].value.copy_(prediction.value)
        for key, value in stats.items():
            if torch.is_tensor(value):
                self.outputs[1][key].copy_(value)
        for static, new in zip(self.outputs[2] or (),
                               postprocessed_tensors(prediction) or ()):
            for key, value in new.items():
                static[key].copy_(value)


def stand_in_capture(step: CUDAGraphStep, batch, beta) -> Captured:
    """``CUDAGraphStep.capture`` with a :class:`StandInGraph`, appended to
    ``step.captures``."""
    method = step.method
    static = static_batch(batch)
    inputs = graph_inputs(static)
    beta_buffer = None if beta is None else torch.full((), float(beta))
    method.zero_grad()
    # CoTTA's teacher too; the random draws (CoTTA's restore) replayed
    teacher = getattr(method, 'teacher', None)
    modules = [method.model] + ([teacher] if teacher is not None else [])
    optimizer = method.optimizer  # None: a step without an update
    state = copy.deepcopy(([m.state_dict() for m in modules],
                           None if optimizer is None else
                           optimizer.state_dict()))
    rng = torch.get_rng_state()
    prediction, stats = method.forward_and_adapt(static, beta_buffer)
    for module, module_state in zip(modules, state[0]):
        module.load_state_dict(module_state)  # nothing ran
    if optimizer is not None:
        # in the optimizer's own ``state`` object, which a real capture
        # keeps (a new one means a loaded state: the graphs are dropped)
        kept = optimizer.state
        optimizer.load_state_dict(state[1])
        kept.clear()
        kept.update(optimizer.state)
        optimizer.state = kept
    torch.set_rng_state(rng)
    post = postprocessed_tensors(prediction)
    graph = StandInGraph(
        lambda: method.forward_and_adapt(static, beta_buffer),
        (prediction, stats, post))
    step.captures.append(graph)
    return Captured(graph, inputs, beta_buffer, prediction, stats, post)


class StandInStream:
    """A CUDA stream that orders nothing (the CPU runs in order)."""

    def wait_stream(self, other):
        pass


@contextmanager
def same_stream(stream):
    yield


def install(monkeypatch=None, loop: bool = False):
    """Replace (through pytest's ``monkeypatch`` where given: undone after
    the test; for good otherwise) CUDA's streams by :class:`StandInStream`
    and every ``CUDAGraphStep``'s capture by :func:`stand_in_capture`, its
    device check skipped. Each step's captures are in its ``captures`` list.
    ``loop``: the online loop also checks its speed options as for a CUDA
    model, so that a config with ``cuda_graph=True`` or a preset runs on
    the CPU."""
    def setattr_(obj, name, value):
        if monkeypatch is None:
            setattr(obj, name, value)
        else:  # ``captures`` is new on the class
            monkeypatch.setattr(obj, name, value, raising=False)

    setattr_(torch.cuda, 'current_stream', StandInStream)
    setattr_(torch.cuda, 'Stream', StandInStream)
    setattr_(torch.cuda, 'stream', same_stream)
    setattr_(CUDAGraphStep, 'captures', property(_captures))
    setattr_(CUDAGraphStep, 'capture', stand_in_capture)
    setattr_(CUDAGraphStep, 'check_method', lambda self: None)
    if loop:
        from mmseg_stag.core.methods import step_graph
        from mmseg_stag.engine import online_loop
        checked = online_loop.speed_options
        capturable = step_graph.check_capturable_optimizer

        def as_on_cuda(device_type, *args, **kwargs):
            return checked('cuda', *args, **kwargs)

        def on_the_cpu(optimizer_cfg):
            # checked as on CUDA; torch's Adam refuses capturable=True for
            # CPU tensors (the same update, its step count on the device)
            cfg = capturable(optimizer_cfg)
            return {k: v for k, v in cfg.items() if k != 'capturable'}

        setattr_(online_loop, 'speed_options', as_on_cuda)
        setattr_(step_graph, 'check_capturable_optimizer', on_the_cpu)


def _captures(step):
    return step.__dict__.setdefault('_stand_in_captures', [])
