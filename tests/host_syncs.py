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
import collections

import torch
from torch.utils._python_dispatch import (TorchDispatchMode,
                                          _disable_current_modes)
from torch.utils._pytree import tree_flatten

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


def watch_launches(monkeypatch, seen, module=None, probe=None):
    """Each launch of ``module``'s Triton kernels (``mmseg_stag.core.
    stag_triton``'s by default, or ``classifier_triton``'s) runs as it
    would, after ``seen(fn, args)``, outside any dispatch mode: the ops
    Triton's interpreter dispatches to run a kernel on the CPU are not the
    step's. ``probe(fn, args, run)``, before the launch, may ``run(other
    args)``: the same launch on other tensors."""
    if module is None:
        from mmseg_stag.core import stag_triton as module
    kernel = module._kernel

    class Watched:
        def __init__(self, fn):
            self.fn = fn

        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                def run(args):
                    with _disable_current_modes():
                        kernel(self.fn)[grid](*args, **kwargs)
                seen(self.fn, args)
                if probe is not None:
                    probe(self.fn, args, run)
                run(args)
            return launch
    monkeypatch.setattr(module, '_kernel', Watched)


def footprint(tensor):
    """The elements a tensor's memory holds (a broadcast dim: one)."""
    n = 1
    for size, stride in zip(tensor.shape, tensor.stride()):
        n *= size if stride else 1
    return n


class FeaturePasses(TorchDispatchMode):
    """How often the dispatched ops and the Triton launches of a step read
    or write a tensor of ``elements`` elements (the classifier's input,
    ``h``): on a GPU, passes over the features through memory, what a
    per-pixel step's extra cost is made of when its kernels are few.
    ``passes``: ``{op or kernel: reads + writes}``. An op's tensor inputs
    are read (an ``out=`` tensor only written) and its outputs written,
    in place or not; views and allocations move nothing;
    ``convolution_backward`` reads its input only for the weight's
    gradient (the input's gradient needs the weight and the output's
    gradient). A Triton launch (in Triton's
    interpreter, through :func:`watch_launches`' ``probe``) is run again
    on copies: an argument is written if a sentinel in it changes, read
    if a NaN in it changes what the launch writes elsewhere."""

    def __init__(self, elements):
        super().__init__()
        self.elements = elements
        self.passes = collections.Counter()

    def feature(self, value):
        return torch.is_tensor(value) and footprint(value) == self.elements

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        name = func.overloadpacket.__name__
        if func.is_view or name in ('detach', 'empty', 'new_empty',
                                    'empty_like', 'empty_strided'):
            return out
        reads = args
        if name == 'convolution_backward' and not args[-1][1]:
            reads = args[:1] + args[2:]  # output_mask: no weight grad
        # an out= tensor is written (it is the output), not read
        reads = (reads, {k: v for k, v in kwargs.items() if k != 'out'})
        count = sum(map(self.feature, tree_flatten(reads)[0])) + \
            sum(map(self.feature, tree_flatten(out)[0]))
        if count:
            self.passes[name] += count
        return out

    def probe(self, fn, args, run):
        with _disable_current_modes():  # the probe's own ops are not counted
            self.probe_launch(fn, args, run)

    def probe_launch(self, fn, args, run):
        def copies(index=None, value=None):
            # each tensor's storage copied, its view kept: the launch's
            # strides are passed apart, as the original's
            out = [torch.empty(0, dtype=a.dtype).set_(
                a.untyped_storage().clone(), a.storage_offset(), a.shape,
                a.stride()) if torch.is_tensor(a) else a for a in args]
            if index is not None:
                out[index].fill_(value)
            run(out)
            return out

        def same(a, b):
            return bool(((a == b) | (a.isnan() & b.isnan())).all())
        plain = copies()
        for i, arg in enumerate(args):
            if not self.feature(arg):
                continue
            written = copies(i, 12345.0)[i]
            self.passes[fn.__name__] += bool((written != 12345.0).any())
            poisoned = copies(i, float('nan'))
            self.passes[fn.__name__] += not all(
                same(a, b) for j, (a, b) in enumerate(zip(poisoned, plain))
                if j != i and torch.is_tensor(a))
