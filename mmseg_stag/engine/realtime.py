"""The stream does not wait: the realistic online protocol of Alfarra et
al. (ICML 2024), "Evaluation of Test-Time Adaptation Under Computational
Time Constraints" (MotasemAlfarra/Online_Test_Time_Adaptation,
``utils/online_eval.py:delayed_eval_online``), as the loop's option
``test_cfg.realtime=dict(cost=C)`` (docs/realtime.md).

Batch ``i`` of a stage arrives at time ``i``, one unit being a forward of
the model; a step started at ``s`` ends at ``s + C``; a batch that arrives
while a step runs is predicted by the current weights, no update. Batches
arrive at whole times, so after each adapted batch the next
``ceil(C) - 1`` are predicted only: the authors'
``delay = max(0, ceil(ratio * eta) - 1)`` with ``eta=1``, counted again
from each stage's first batch (theirs restarts with each corruption's
loader). ``cost=1`` (or less) adapts on every batch: the offline run.

``cost='measure'`` times the step and the forward on the stream's first
batch before the stream (``warmup`` of each first, then the median of
``repeats``), the model and the method restored afterwards, and uses their
ratio for the whole run: one schedule, which the recorded cost reruns.
The authors time every adapted batch again (their schedule varies from
run to run); a fixed cost is the deliberate deviation that makes a run
repeatable.
"""
import copy
import math
import platform
import statistics
import time
from dataclasses import dataclass
from typing import Callable, List, Optional

import torch

MEASURE = 'measure'
OPTIONS = ('cost', 'warmup', 'repeats')


@dataclass
class Realtime:
    """The protocol of one run: its ``cost`` (None until measured) and how
    it was obtained (``'given'``, ``'measured'``)."""
    cost: Optional[float]
    how: str
    warmup: int = 2
    repeats: int = 5
    #: the measurement (seconds of the step and of the forward, the
    #: device, what was timed), None for a given cost
    measured: Optional[dict] = None

    @property
    def period(self) -> int:
        """One adapted batch in ``period``: ``ceil(cost)``, at least 1."""
        return max(1, math.ceil(self.cost))

    def adapts(self, position: int) -> bool:
        """Whether the batch at ``position`` of its stage (0: its first)
        adapts: no step runs when it arrives."""
        return position % self.period == 0

    def describe(self) -> str:
        """The protocol in a log line's words."""
        if self.cost is None:
            return ('; realtime: a step\'s cost in forwards is measured on '
                    'the first batch')
        return (f'; realtime: a step costs {self.cost:.3g} forwards '
                f'({self.how}), 1 batch in {self.period} adapts, the rest '
                'are predicted only')

    def record(self, adapted: int, batches: int) -> dict:
        """What the results say of the protocol (``adapted`` of
        ``batches`` adapted)."""
        return dict(cost=self.cost, how=self.how, period=self.period,
                    batches_adapted=int(adapted),
                    batches_predicted_only=int(batches - adapted),
                    measured=self.measured)


def realtime_options(cfg, cuda_graph: bool = False) -> Optional[Realtime]:
    """``test_cfg.realtime`` checked: None (the offline protocol), or a
    dict with ``cost`` (a number > 0, or ``'measure'``) and, with
    ``'measure'``, ``warmup`` and ``repeats``; ``ValueError`` naming the
    option otherwise, and for ``'measure'`` with ``cuda_graph``, where the
    step cannot be timed as it runs (a graph's first steps are its
    capture, and the optimizer state restored after timing is captured
    again)."""
    if cfg is None:
        return None
    if not isinstance(cfg, dict):
        raise ValueError('test_cfg.realtime must be a dict, e.g. '
                         f"dict(cost=2.5) or dict(cost='measure'); got "
                         f'{cfg!r}')
    unknown = sorted(set(cfg) - set(OPTIONS))
    if unknown or 'cost' not in cfg:
        raise ValueError(f'test_cfg.realtime takes {", ".join(OPTIONS)} '
                         f'(cost required); got {sorted(cfg)}')
    cost = cfg['cost']
    if cost == MEASURE and cuda_graph:
        raise ValueError(
            "test_cfg.realtime.cost='measure' times eager steps; with "
            'cuda_graph=True give the cost (measure it once without '
            'cuda_graph)')
    if cost == MEASURE:
        warmup, repeats = cfg.get('warmup', 2), cfg.get('repeats', 5)
        if not (isinstance(warmup, int) and not isinstance(warmup, bool)
                and warmup >= 0):
            raise ValueError('test_cfg.realtime.warmup must be an integer '
                             f'>= 0, got {warmup!r}')
        if not (isinstance(repeats, int) and not isinstance(repeats, bool)
                and repeats >= 1):
            raise ValueError('test_cfg.realtime.repeats must be an integer '
                             f'>= 1, got {repeats!r}')
        return Realtime(None, 'measured', warmup, repeats)
    given = sorted(set(cfg) & {'warmup', 'repeats'})
    if given:
        raise ValueError(f'test_cfg.realtime.{given[0]} is for '
                         "cost='measure'; a given cost is not timed")
    if isinstance(cost, bool) or not isinstance(cost, (int, float)) or \
            not math.isfinite(cost) or cost <= 0:
        raise ValueError('test_cfg.realtime.cost must be a number > 0 (a '
                         "step's time in forwards of the model) or "
                         f"'measure', got {cost!r}")
    return Realtime(float(cost), 'given')


def measure_cost(realtime: Realtime, step: Callable[[], None],
                 forward: Callable[[], None], device: torch.device) -> None:
    """Set ``realtime.cost`` to the median time of ``step`` over that of
    ``forward`` (each after ``realtime.warmup`` calls; on CUDA the device
    waited for around each), and ``realtime.measured`` to the figures."""
    sync = torch.cuda.synchronize if device.type == 'cuda' else \
        (lambda: None)
    step_s = median_seconds(step, realtime.warmup, realtime.repeats, sync)
    forward_s = median_seconds(forward, realtime.warmup, realtime.repeats,
                               sync)
    name = torch.cuda.get_device_name(device) if device.type == 'cuda' \
        else platform.processor() or platform.machine()
    realtime.cost = step_s / forward_s
    realtime.measured = dict(step_seconds=step_s, forward_seconds=forward_s,
                             device=str(device), device_name=name,
                             warmup=realtime.warmup,
                             repeats=realtime.repeats)


def stage_positions(stage_of_batch: List[int]) -> List[int]:
    """Each batch's position in its stage (0 at a stage's first batch),
    from each batch's stage index in stream order."""
    positions, previous, k = [], None, 0
    for stage in stage_of_batch:
        k = k + 1 if stage == previous else 0
        positions.append(k)
        previous = stage
    return positions


def median_seconds(run: Callable[[], None], warmup: int, repeats: int,
                   sync: Callable[[], None]) -> float:
    """The median time of ``run`` over ``repeats`` calls after ``warmup``
    (``sync`` waits for the device before each clock reading)."""
    for _ in range(warmup):
        run()
    times = []
    for _ in range(repeats):
        sync()
        start = time.perf_counter()
        run()
        sync()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def snapshot(value):
    """A copy of ``value`` (a state dict: dicts, lists, tuples walked),
    each tensor cloned where it is: what a measurement restores."""
    if torch.is_tensor(value):
        return value.detach().clone()
    if isinstance(value, dict):
        return type(value)((k, snapshot(v)) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return type(value)(snapshot(v) for v in value)
    return copy.deepcopy(value)
