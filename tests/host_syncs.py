"""Counting host-device synchronisations on the CPU.

On a GPU, reading a value (``.item()``, ``bool()``, ``.tolist()``), a
boolean-mask index or any op whose output size depends on the data waits
until the device has run everything queued. The CPU has no queue, so these
tests count the operations that would wait instead: the aten ops below,
seen by a ``TorchDispatchMode``, and the Python-side reads (``tolist``,
``numpy``, ``cpu``) that never reach the dispatcher on a CPU tensor."""
import torch
from torch.utils._python_dispatch import TorchDispatchMode

#: aten ops that read a value or a data-dependent size back to the host
SYNC_OPS = frozenset({
    '_local_scalar_dense', 'nonzero', 'nonzero_static', 'masked_select',
    'unique', '_unique', '_unique2', 'unique_consecutive', 'unique_dim',
    'repeat_interleave', 'histc', 'bincount'})
#: ``torch.Tensor`` methods that copy to the host
HOST_READS = ('tolist', 'numpy', 'cpu', 'item')


class HostSyncCounter(TorchDispatchMode):
    """Records the would-be synchronisations while active and not paused."""

    def __init__(self):
        super().__init__()
        self.calls = []
        self.paused = 0

    def record(self, name):
        if not self.paused:
            self.calls.append(name)

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


def pause_optimizer_step_counts(monkeypatch, counter):
    """Do not count torch's reads of an optimizer's ``step``: it is a CPU
    tensor on a GPU too (unless ``capturable``), so reading it never
    waits for the device; on the CPU it would look like a read."""
    import importlib
    import pkgutil
    for info in pkgutil.iter_modules(torch.optim.__path__):
        module = importlib.import_module(f'torch.optim.{info.name}')
        if hasattr(module, '_get_value'):
            monkeypatch.setattr(module, '_get_value',
                                paused(counter, module._get_value))


def paused(counter, fn):
    """``fn`` with the counter paused (the metric's own reads)."""
    def run(*args, **kwargs):
        counter.paused += 1
        try:
            return fn(*args, **kwargs)
        finally:
            counter.paused -= 1
    return run


def count_loop_syncs(loop, monkeypatch):
    """Wrap ``loop.run_iter``: returns ``{batch index: [sync names]}``,
    filled as the loop runs, without the metric (``task.outputs`` and
    ``evaluator.process``)."""
    counter = HostSyncCounter()
    state = dict(active=False)
    per_batch = {}
    patch_host_reads(monkeypatch, counter, lambda: state['active'])
    pause_optimizer_step_counts(monkeypatch, counter)
    run_iter = loop.run_iter
    loop.evaluator.process = paused(counter, loop.evaluator.process)
    def counted(idx, data_batch):
        counter.calls = []
        state['active'] = True
        try:
            with counter:
                run_iter(idx, data_batch)
        finally:
            state['active'] = False
        per_batch[idx] = list(counter.calls)

    monkeypatch.setattr(loop.task, 'outputs',
                        paused(counter, loop.task.outputs))
    monkeypatch.setattr(loop, 'run_iter', counted)
    return per_batch
