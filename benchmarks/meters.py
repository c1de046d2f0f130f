"""Meters of one step or one run: time, peak memory, autograd's saved
tensors, forward and backward passes, host-device transfers."""
import collections
import ctypes
import os
import os.path as osp
import threading
import time
import traceback

import torch
from torch.utils._python_dispatch import TorchDispatchMode


def rss_bytes():
    with open('/proc/self/statm') as f:
        return int(f.read().split()[1]) * os.sysconf('SC_PAGE_SIZE')


class PeakMemory:
    """Peak memory above the start of the block: on a GPU
    ``max_memory_allocated`` (``peak``) and ``max_memory_reserved``
    (``peak_reserved``); on the CPU the RSS, sampled every 0.5 ms.

    A GPU's peak statistics are global: whatever resets them inside the
    block (a nested block, MMEngine's log processor) must fold them first
    (:func:`fold_peak_memory`)."""

    #: the open blocks on a GPU, outermost first
    active = []

    def __enter__(self):
        self.cuda = torch.cuda.is_available()
        if self.cuda:
            torch.cuda.synchronize()
            fold_peak_memory()  # the enclosing blocks keep their peaks
            torch.cuda.reset_peak_memory_stats()
            self.start = torch.cuda.memory_allocated()
            self.peak = self.peak_reserved = 0
            PeakMemory.active.append(self)
            return self
        try:  # freed heap pages back to the OS: RSS growth is the step's
            ctypes.CDLL('libc.so.6').malloc_trim(0)
        except (OSError, AttributeError):
            pass
        self.start = self.peak = rss_bytes()
        self._running = True
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def fold(self):
        """Take the device's peaks since the last reset into this block's."""
        self.peak = max(self.peak, torch.cuda.max_memory_allocated())
        self.peak_reserved = max(self.peak_reserved,
                                 torch.cuda.max_memory_reserved())

    def _sample(self):
        while self._running:
            self.peak = max(self.peak, rss_bytes())
            time.sleep(0.0005)

    def __exit__(self, *exc):
        if self.cuda:
            torch.cuda.synchronize()
            self.fold()
            PeakMemory.active.remove(self)
            self.reserved_mb = self.peak_reserved / 2**20
        else:
            self._running = False
            self._thread.join()
            self.peak = max(self.peak, rss_bytes())
        self.delta_mb = (self.peak - self.start) / 2**20


def fold_peak_memory():
    """Fold the device's peaks into every open :class:`PeakMemory` block:
    call it before anything resets ``torch.cuda``'s peak statistics."""
    for block in PeakMemory.active:
        block.fold()


class PassCounter:
    """Counts the forward passes of one module (a forward pre-hook)."""

    def __init__(self, module):
        self.forwards = 0
        self.handle = module.register_forward_pre_hook(self._count_forward)

    def _count_forward(self, *_):
        self.forwards += 1


class BackwardPasses:
    """Counts autograd's backward passes of the graphs built in the block,
    through the saved-tensor hooks: a pass starts at the first unpack of a
    saved tensor after tensors were saved (a backward through a graph that
    saved nothing is not seen)."""

    def __init__(self):
        self.count = 0
        self._saving = False

    def _pack(self, tensor):
        self._saving = True
        return tensor

    def _unpack(self, tensor):
        if self._saving:  # the first unpack of a new backward pass
            self._saving = False
            self.count += 1
            self.backward_started()
        return tensor

    def backward_started(self):
        """Called as a backward pass starts."""

    def __enter__(self):
        self._hooks = torch.autograd.graph.saved_tensors_hooks(
            self._pack, self._unpack)
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc):
        self._hooks.__exit__(*exc)


class SavedForBackward(BackwardPasses):
    """Bytes of the distinct storages autograd saves for backward. ``mb``:
    the largest graph of the block (EcoTTA's two updates free the first
    graph first), parameters included; ``activations_mb``: without the
    model's parameters and buffers; ``count``: the backward passes."""

    def __init__(self, model=None):
        super().__init__()
        self.model_storages = set() if model is None else {
            t.untyped_storage().data_ptr()
            for t in list(model.parameters()) + list(model.buffers())}

    def backward_started(self):  # the graph is complete
        self._fold()

    def _fold(self):
        total = sum(self.storages.values())
        acts = sum(n for p, n in self.storages.items()
                   if p not in self.model_storages)
        self.peak = max(self.peak, total)
        self.peak_acts = max(self.peak_acts, acts)
        self.storages = {}

    def _pack(self, tensor):
        storage = tensor.untyped_storage()
        self.storages[storage.data_ptr()] = storage.nbytes()
        return super()._pack(tensor)

    def __enter__(self):
        self.storages, self.peak, self.peak_acts = {}, 0, 0
        return super().__enter__()

    def __exit__(self, *exc):
        super().__exit__(*exc)
        self._fold()
        self.mb = self.peak / 2**20
        self.activations_mb = self.peak_acts / 2**20


class StepTimer:
    """Seconds of the block: CUDA events around it on a GPU (read after a
    synchronisation), ``perf_counter`` on the CPU."""

    def __init__(self, cuda=None):
        self.cuda = torch.cuda.is_available() if cuda is None else cuda

    def __enter__(self):
        if self.cuda:
            self.events = [torch.cuda.Event(enable_timing=True)
                           for _ in range(2)]
            self.events[0].record()
        else:
            self.start = time.perf_counter()
        return self

    def __exit__(self, *exc):
        if self.cuda:
            self.events[1].record()
            torch.cuda.synchronize()
            self.seconds = self.events[0].elapsed_time(self.events[1]) / 1e3
        else:
            self.seconds = time.perf_counter() - self.start


class HostTransfers(TorchDispatchMode):
    """Counts, while active, what moves values between the device and the
    host, by kind (``kinds``) and by call site (``file:line function`` of
    the first frame outside torch): ``device_read`` (a value or a
    data-dependent size read from a device tensor: the host waits),
    ``host_read`` (the same of a CPU tensor, e.g. an optimizer's ``step``:
    no wait), ``to_device`` / ``to_host`` (copies). On the CPU every read
    is a ``host_read``."""

    #: aten ops that read a value or a data-dependent size to the host
    READ_OPS = frozenset({
        '_local_scalar_dense', 'nonzero', 'nonzero_static', 'masked_select',
        'unique', '_unique', '_unique2', 'unique_consecutive', 'unique_dim',
        'repeat_interleave', 'histc', 'bincount'})

    def __init__(self):
        super().__init__()
        self.sites, self.kinds = collections.Counter(), collections.Counter()

    def _record(self, kind):
        here = osp.dirname(torch.__file__)
        for frame in reversed(traceback.extract_stack()[:-2]):
            if not frame.filename.startswith(here) and \
                    frame.filename != __file__:
                site = (f'{osp.relpath(frame.filename)}:{frame.lineno} '
                        f'{frame.name}')
                break
        else:
            site = 'torch'
        self.sites[(kind, site)] += 1
        self.kinds[kind] += 1

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = func.overloadpacket.__name__
        if name in self.READ_OPS:
            self._record('host_read' if args[0].device.type == 'cpu'
                         else 'device_read')
        elif name in ('_to_copy', 'copy_'):
            src = args[1] if name == 'copy_' else args[0]
            dst = args[0].device if name == 'copy_' else torch.device(
                kwargs.get('device') or src.device)
            if (src.device.type == 'cpu') != (dst.type == 'cpu'):
                self._record('to_host' if dst.type == 'cpu' else 'to_device')
        return func(*args, **kwargs)

    def top_sites(self):
        """The 10 busiest ``(kind, site, calls)``."""
        return [(kind, site, n) for (kind, site), n in
                self.sites.most_common(10)]
