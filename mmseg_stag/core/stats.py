"""What one adaptation step logs, typed: every STAG value has its field.

A method fills a :class:`PassStats` per forward pass and returns a
:class:`StepStats` with ``adapt``'s prediction; the loop reads it at the
logger's interval and stops the run on a non-finite ``loss_stag``.
"""
from abc import abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

#: a float, or a 0-d tensor read later (reading waits for the device)
Stat = Any

#: the loss terms of a pass, in the order they are logged
LOSS_TERMS = ('loss_base', 'loss_stag', 'beta', 'loss')


class Logged(Mapping):
    """Read-only mapping of a record's logged names (its ``logged()``)."""

    @abstractmethod
    def logged(self) -> Dict[str, Stat]:
        """Every value by its logged name."""

    def __getitem__(self, key: str) -> Stat:
        return self.logged()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.logged())

    def __len__(self) -> int:
        return len(self.logged())


@dataclass
class PassStats(Logged):
    """One forward pass: its loss terms (eq:total_objective: ``L_base``,
    ``L_STAG``, ``beta_t`` and their sum) and the method's own numbers
    (``extra``: kept samples, a regulariser, ...); read as a mapping of the
    logged names (``fwd.stats['num_kept']``)."""
    loss_base: Optional[Stat] = None
    loss_stag: Optional[Stat] = None
    beta: Optional[Stat] = None
    loss: Optional[Stat] = None
    extra: Dict[str, Stat] = field(default_factory=dict)

    def logged(self, suffix: str = '') -> Dict[str, Stat]:
        """The set values by logged name (``suffix`` after each)."""
        out = {k + suffix: v for k, v in self.extra.items()}
        out.update((k + suffix, getattr(self, k)) for k in LOSS_TERMS
                   if getattr(self, k) is not None)
        return out

    def map(self, fn: Callable[[Stat], Stat]) -> 'PassStats':
        """A copy with ``fn`` applied to every set value."""
        terms = {k: None if getattr(self, k) is None else fn(getattr(self, k))
                 for k in LOSS_TERMS}
        return PassStats(extra={k: fn(v) for k, v in self.extra.items()},
                         **terms)


@dataclass
class StepStats(Logged):
    """One step: its ``passes`` and its own numbers (``extra``); read as a
    mapping of the logged names (``stats['loss_stag']``), the passes'
    numbered (``loss1``, ``loss2``) where there are several or
    ``numbered`` (SAR, whose second pass may not run)."""
    passes: List[PassStats]
    extra: Dict[str, Stat] = field(default_factory=dict)
    numbered: bool = False

    def suffixes(self) -> List[str]:
        if len(self.passes) > 1 or self.numbered:
            return [str(i + 1) for i in range(len(self.passes))]
        return [''] * len(self.passes)

    def stag_values(self) -> List[Tuple[str, Stat]]:
        """``(logged name, L_STAG)`` of every pass that has one."""
        return [('loss_stag' + s, p.loss_stag)
                for p, s in zip(self.passes, self.suffixes())
                if p.loss_stag is not None]

    def logged(self) -> Dict[str, Stat]:
        """Every value by its logged name."""
        out = {}
        for p, s in zip(self.passes, self.suffixes()):
            out.update(p.logged(s))
        out.update(self.extra)
        return out

    def map(self, fn: Callable[[Stat], Stat]) -> 'StepStats':
        """A copy with ``fn`` applied to every value."""
        return StepStats([p.map(fn) for p in self.passes],
                         {k: fn(v) for k, v in self.extra.items()},
                         self.numbered)
