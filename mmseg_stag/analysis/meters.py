"""Meters of one step or one run: time, peak memory, autograd's saved
tensors, forward and backward passes.

Used by ``tools/benchmark.py`` (per adaptation step), ``tools/gpu_check.py``
and ``tools/analysis/efficiency.py`` (per whole run).
"""
import os
import threading
import time

import torch


def release_freed_memory():
    """Return freed heap pages to the OS so that RSS growth during the next
    step measures that step (glibc keeps freed memory otherwise)."""
    try:
        import ctypes
        ctypes.CDLL('libc.so.6').malloc_trim(0)
    except (OSError, AttributeError):
        pass


def rss_bytes():
    with open('/proc/self/statm') as f:
        return int(f.read().split()[1]) * os.sysconf('SC_PAGE_SIZE')


class PeakMemory:
    """Peak memory above the starting point while the block runs.

    On a GPU the peak is ``torch.cuda.max_memory_allocated`` (``peak``) and
    ``max_memory_reserved`` (``peak_reserved``) over the WHOLE block: every
    ``torch.cuda.reset_peak_memory_stats`` call inside it (MMEngine's
    ``LogProcessor`` makes one at every log interval) first folds the
    counter into a running maximum, else only the last interval's peak
    would be left. On the CPU: the RSS, sampled every 0.5 ms by a thread.
    """

    def __enter__(self):
        self.cuda = torch.cuda.is_available()
        if self.cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()  # an outer block folds
            self.start = torch.cuda.memory_allocated()
            self.peak = self.peak_reserved = 0
            self._reset = torch.cuda.reset_peak_memory_stats
            torch.cuda.reset_peak_memory_stats = self._folding_reset
            return self
        release_freed_memory()
        self.start = self.peak = rss_bytes()
        self._running = True
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _fold(self):
        """Fold the CUDA peak counters into the running maxima."""
        self.peak = max(self.peak, torch.cuda.max_memory_allocated())
        self.peak_reserved = max(self.peak_reserved,
                                 torch.cuda.max_memory_reserved())

    def _folding_reset(self, *args, **kwargs):
        """``torch.cuda.reset_peak_memory_stats``, after a fold."""
        self._fold()
        return self._reset(*args, **kwargs)

    def _sample(self):
        while self._running:
            self.peak = max(self.peak, rss_bytes())
            time.sleep(0.0005)

    def __exit__(self, *exc):
        if self.cuda:
            torch.cuda.synchronize()
            self._fold()
            torch.cuda.reset_peak_memory_stats = self._reset
            self.reserved_mb = self.peak_reserved / 2**20
        else:
            self._running = False
            self._thread.join()
            self.peak = max(self.peak, rss_bytes())
        self.delta_mb = (self.peak - self.start) / 2**20


class PassCounter:
    """Counts the calls of one module (the decode head, or the whole
    classifier network) and autograd backward calls."""

    def __init__(self, module):
        self.forwards = self.backwards = 0

        def count(*_):
            self.forwards += 1

        module.register_forward_pre_hook(count)

    def __enter__(self):
        self._backward = torch.autograd.backward

        def counted(*args, **kwargs):
            self.backwards += 1
            return self._backward(*args, **kwargs)

        torch.autograd.backward = counted
        return self

    def __exit__(self, *exc):
        torch.autograd.backward = self._backward


class SavedForBackward:
    """Bytes of the distinct tensor storages autograd saves for a backward
    pass: the graph's memory, exact and free of allocator noise, unlike
    peak RSS. ``mb``: the largest graph of the block (a method with two
    updates per step, EcoTTA, frees the first before building the second),
    parameters included; ``activations_mb``: the same without the model's
    parameters and buffers (what the backward pass keeps of the batch)."""

    def __init__(self, model=None):
        self.model_storages = set() if model is None else {
            t.untyped_storage().data_ptr()
            for t in list(model.parameters()) + list(model.buffers())}

    def _fold(self):
        total = sum(self.storages.values())
        acts = sum(n for p, n in self.storages.items()
                   if p not in self.model_storages)
        self.peak = max(self.peak, total)
        self.peak_acts = max(self.peak_acts, acts)
        self.storages = {}

    def __enter__(self):
        self.storages, self.peak, self.peak_acts = {}, 0, 0

        def pack(tensor):
            storage = tensor.untyped_storage()
            self.storages[storage.data_ptr()] = storage.nbytes()
            return tensor

        self._hooks = torch.autograd.graph.saved_tensors_hooks(
            pack, lambda tensor: tensor)
        self._hooks.__enter__()
        self._backward = torch.autograd.backward

        def backward(*args, **kwargs):  # one graph is complete
            self._fold()
            return self._backward(*args, **kwargs)

        torch.autograd.backward = backward
        return self

    def __exit__(self, *exc):
        torch.autograd.backward = self._backward
        self._hooks.__exit__(*exc)
        self._fold()
        self.mb = self.peak / 2**20
        self.activations_mb = self.peak_acts / 2**20


class StepTimer:
    """Seconds of the block: CUDA events around it on a GPU (the kernels'
    time, read after a synchronisation), ``perf_counter`` on the CPU."""

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
