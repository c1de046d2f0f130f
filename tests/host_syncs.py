"""Counting host-device synchronisations on the CPU.

On a GPU, reading a value (``.item()``, ``bool()``, ``.tolist()``), a
boolean-mask index or any op whose output size depends on the data waits
until the device has run everything queued. The CPU has no queue, so these
tests count the operations that would wait instead: the aten ops below,
seen by a ``TorchDispatchMode``, and the Python-side reads (``tolist``,
``numpy``, ``cpu``) that never reach the dispatcher on a CPU tensor.

Some reads are of tensors that stay on the host on a GPU too: an
optimizer's ``step`` count (torch's Adam, AdamW and SGD keep it on the CPU
unless ``fused`` or ``capturable``). They never wait for the device but
cost the host a call each; the counter records them apart
(``host_reads``), so a test can tell the two kinds."""

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from benchmarks.meters import HostTransfers

#: aten ops that read a value or a data-dependent size back to the host
SYNC_OPS = HostTransfers.READ_OPS
#: ``torch.Tensor`` methods that copy to the host
HOST_READS = ('tolist', 'numpy', 'cpu', 'item')


class HostSyncCounter(TorchDispatchMode):
    """Records, while active and not paused, the would-be synchronisations
    (``calls``) and the reads of host-resident tensors (``host_reads``)."""

    def __init__(self):
        super().__init__()
        self.calls = []
        self.host_reads = []
        self.paused = 0
        self.on_host = 0  # > 0 while reading a host-resident tensor

    def record(self, name):
        if not self.paused:
            (self.host_reads if self.on_host else self.calls).append(name)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if name in SYNC_OPS:
            self.record(name)
        return func(*args, **(kwargs or {}))


def patch_host_reads(monkeypatch, counter, active):
    """Count ``Tensor.tolist/numpy/cpu/item`` while ``active()``."""
    for name in HOST_READS:
        original = getattr(torch.Tensor, name)

        def wrapper(self, *args, _original=original, _name=name, **kwargs):
            if active():
                counter.record(_name)
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, wrapper)


def optimizer_step_counts_on_host(monkeypatch, counter):
    """Record torch's reads of an optimizer's ``step`` as host reads: it
    is a CPU tensor on a GPU too (unless ``fused`` or ``capturable``), so
    reading it never waits for the device."""
    import importlib
    import pkgutil
    for info in pkgutil.iter_modules(torch.optim.__path__):
        module = importlib.import_module(f'torch.optim.{info.name}')
        if hasattr(module, '_get_value'):
            monkeypatch.setattr(module, '_get_value', flagged(
                counter, 'on_host', module._get_value))


def flagged(counter, flag, fn):
    """``fn`` with the counter's ``flag`` raised while it runs."""
    def run(*args, **kwargs):
        setattr(counter, flag, getattr(counter, flag) + 1)
        try:
            return fn(*args, **kwargs)
        finally:
            setattr(counter, flag, getattr(counter, flag) - 1)
    return run


def paused(counter, fn):
    """``fn`` with the counter paused (the metric's own reads)."""
    return flagged(counter, 'paused', fn)


def count_loop_syncs(loop, monkeypatch, host_reads=None, stats_reads=None):
    """Wrap ``loop.run_iter``: returns ``{batch index: [sync names]}``,
    filled as the loop runs, without the metric (``task.outputs`` and
    ``evaluator.process``); ``host_reads``, a dict if given, gets the
    batch's reads of host-resident tensors the same way; ``stats_reads``,
    a list if given, the sync names of each read of the statistics
    (``loop.log_stats``, at the logger's interval and a stage's end)."""
    counter = HostSyncCounter()
    state = dict(active=False)
    per_batch = {}
    patch_host_reads(monkeypatch, counter, lambda: state['active'])
    optimizer_step_counts_on_host(monkeypatch, counter)
    run_iter = loop.run_iter
    loop.evaluator.process = paused(counter, loop.evaluator.process)
    def counted(idx, data_batch):
        counter.calls, counter.host_reads = [], []
        state['active'] = True
        try:
            with counter:
                run_iter(idx, data_batch)
        finally:
            state['active'] = False
        per_batch[idx] = list(counter.calls)
        if host_reads is not None:
            host_reads[idx] = list(counter.host_reads)

    log_stats = loop.log_stats

    def counted_log_stats():
        outer, counter.calls = counter.calls, []
        state['active'] = True
        try:
            with counter:
                log_stats()
        finally:
            state['active'] = False
            if stats_reads is not None:
                stats_reads.append(list(counter.calls))
            counter.calls = outer

    monkeypatch.setattr(loop.task, 'outputs',
                        paused(counter, loop.task.outputs))
    monkeypatch.setattr(loop, 'run_iter', counted)
    monkeypatch.setattr(loop, 'log_stats', counted_log_stats)
    return per_batch


class OpCounter(TorchDispatchMode):
    """Records the name of every dispatched op that is not a view: on a
    GPU each is a kernel launch (a view is metadata only)."""

    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not func.is_view and func.overloadpacket.__name__ != 'detach':
            self.ops.append(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))


def count_dispatched_ops(fn):
    """The non-view ops that ``fn()`` dispatches, autograd's included."""
    counter = OpCounter()
    with counter:
        fn()
    return counter.ops


def count_whole_loop(loop, monkeypatch):
    """Wrap ``loop.run_iter`` and ``loop.end_stage``, nothing paused (the
    task's outputs and the metric counted too): returns ``(per_batch,
    stage_ends)``, ``{batch index: [sync names]}`` of every whole loop
    iteration and, per stage end, its sync names; an optimizer's host
    step count (not a wait for the device) is left out."""
    counter = HostSyncCounter()
    state = dict(active=False)
    per_batch, stage_ends = {}, []
    patch_host_reads(monkeypatch, counter, lambda: state['active'])
    optimizer_step_counts_on_host(monkeypatch, counter)

    def counted(fn, record):
        def run(*args, **kwargs):
            counter.calls, counter.host_reads = [], []
            state['active'] = True
            try:
                with counter:
                    return fn(*args, **kwargs)
            finally:
                state['active'] = False
                record(args, list(counter.calls))
        return run

    monkeypatch.setattr(loop, 'run_iter', counted(
        loop.run_iter, lambda args, calls: per_batch.__setitem__(
            args[0], calls)))
    monkeypatch.setattr(loop, 'end_stage', counted(
        loop.end_stage, lambda args, calls: stage_ends.append(calls)))
    return per_batch, stage_ends
