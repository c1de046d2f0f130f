"""Table efficiency through ``tools/analysis/efficiency.py`` on the tiny
CIFAR-C stream: passes counted in images (Source: no backward; TENT and
TENT+STAG: every image once forward and once backward), time and memory
measured, the paper's layout written; on a GPU the memory is the whole
run's peak although MMEngine's log processor resets the counter at every
log interval (simulated here)."""
import functools
import json
from types import SimpleNamespace

import pytest
import torch
from cls_helpers import CIFAR, killable_config, options
from mmengine.runner import LogProcessor

from benchmarks import meters


@pytest.fixture
def efficiency(load_tool):
    """The command tools/analysis/efficiency.py, loaded by its path."""
    return load_tool('analysis/efficiency')


def test_passes_time_memory(tmp_path, stream, names, checkpoint, efficiency):
    _, root = stream
    rows = []
    for name, leaf in (('Source', 'source'), ('TENT', 'tent'),
                       ('+STAG', 'tent-stag')):
        folder = tmp_path / leaf
        folder.mkdir()
        opts = options(root, names, batch_size=8)
        if leaf == 'source':
            opts.pop('test_cfg.method.optimizer')
        rows += ['--row', name, killable_config(CIFAR.format(leaf), opts,
                                                folder, kill=False)]
    work = tmp_path / 'eff'
    table = efficiency.main([checkpoint, *rows, '--images', '24',
                             '--condition', names[1], '--work-dir',
                             str(work)])
    assert table['Source']['forward'] == 24
    assert table['Source']['backward'] == 0
    for name in ('TENT', '+STAG'):  # one forward, one backward per batch
        assert table[name]['forward'] == table[name]['backward'] == 24
        assert table[name]['backward_passes'] == 3
    for r in table.values():
        assert r['images'] == 24 and r['time_s'] > 0 and r['memory_mb'] > 0
    saved = json.load(open(work / 'efficiency.json'))
    assert saved['rows'] == table and saved['device']
    text = open(work / 'efficiency.txt').read().splitlines()
    assert text[1].split() == ['Method', 'Forward', 'Backward', 'Time',
                               '(s)', 'Memory', '(MB)']
    assert text[2].split()[:3] == ['Source', '24', 'N/A']
    assert (work / 'efficiency.png').stat().st_size > 10000
    res = json.load(open(work / 'TENT' / 'continual_results.json'))
    assert [s['condition'] for s in res['stages']] == [names[1]]


class FakeCudaCounter:
    """CUDA's allocated-bytes counter and its peak, simulated on the CPU
    (``torch.cuda`` functions replaced for the test)."""

    def __init__(self, monkeypatch):
        self.allocated = self.peak = 0
        fake = dict(is_available=lambda: True,
                    synchronize=lambda *a, **k: None,
                    memory_allocated=lambda *a, **k: self.allocated,
                    max_memory_allocated=lambda *a, **k: self.peak,
                    max_memory_reserved=lambda *a, **k: self.peak,
                    reset_peak_memory_stats=self.reset)
        for name, function in fake.items():
            monkeypatch.setattr(torch.cuda, name, function)

    def batch(self, mb):
        """A batch that allocates ``mb`` MB, then frees them."""
        self.allocated += mb * 2**20
        self.peak = max(self.peak, self.allocated)
        self.allocated -= mb * 2**20

    def reset(self, *args, **kwargs):
        self.peak = self.allocated


def test_gpu_memory_is_the_whole_runs_peak(monkeypatch, efficiency):
    """A 900 MB batch early in the run, then MMEngine's log line (its
    ``LogProcessor`` reads the peak and resets it), then 100 MB batches:
    the run's peak is 900 MB, not the last window's 100 MB. The meter's
    hook folds the peak after each batch, before the logger (a higher
    priority than ``LoggerHook``'s); nothing of torch is replaced."""
    from mmengine.hooks import LoggerHook
    from mmengine.registry import HOOKS
    counter = FakeCudaCounter(monkeypatch)
    # CUDA events cannot be simulated: the wall-clock timer
    monkeypatch.setattr(meters, 'StepTimer',
                        functools.partial(meters.StepTimer, cuda=False))
    log_processor = LogProcessor()
    runner = SimpleNamespace(model=torch.nn.Module())
    meter = efficiency.Meter()
    hook = efficiency.meter_hook(meter)
    logger = HOOKS.build(dict(type='LoggerHook'))
    assert isinstance(logger, LoggerHook)
    order = {'HIGHEST': 0, 'VERY_HIGH': 10, 'HIGH': 30, 'ABOVE_NORMAL': 40,
             'NORMAL': 50, 'BELOW_NORMAL': 60, 'LOW': 70, 'VERY_LOW': 90,
             'LOWEST': 100}
    assert order[hook.priority] < order[logger.priority]
    with meter:
        for batch_idx, mb in enumerate((900, 100, 100)):
            counter.batch(mb)
            hook.after_test_iter(runner, batch_idx)  # before the logger
            assert log_processor._get_max_memory(runner) == mb  # its line
    assert meter.peak_mb == 900
    assert meter.memory.reserved_mb == 900
    assert torch.cuda.reset_peak_memory_stats == counter.reset
