"""The planner's workload input as the run shows it: the input lengths of recent arrivals.

The control loops re-plan from the routed lengths of the requests that arrived in the last
`window` once there are `min_samples` of them; before that, from the scenario's configured
distribution. That is what lets t and the PD split follow a shift in traffic rather than the
distribution the run was started with (`ControlLoops.inputs`).
"""

from __future__ import annotations

from bisect import bisect_left
from collections import deque
from itertools import islice
from operator import itemgetter
from typing import TypeVar

from testbed.workload.lengths import EmpiricalLengths, LengthDistribution

__all__ = ["MAX_OBSERVED", "ObservedLengths", "tail_since"]

MAX_OBSERVED = 5000
"""Cap on remembered arrivals (a 30 s window at 100+ req/s is far beyond any scenario here)."""
T = TypeVar("T")
_time, _value = itemgetter(0), itemgetter(1)


def tail_since(entries: deque[tuple[float, T]], cutoff: float) -> list[T]:
    """The values of the (time, value) entries at or after `cutoff`, in order, for entries
    appended in time order: how many there are is found by bisection, and they are copied
    from the newest end in C, rather than read one by one in Python at every re-plan."""
    count = len(entries) - bisect_left(entries, cutoff, key=_time)
    recent = list(map(_value, islice(reversed(entries), count)))
    recent.reverse()
    return recent


class ObservedLengths:
    """The latest MAX_OBSERVED arrivals (real-world time, routed input length) of one router."""

    def __init__(self, configured: LengthDistribution, window: float, min_samples: int) -> None:
        self.configured = configured
        """The scenario's distribution: the planner's input until `min_samples` arrived."""
        self.window = window
        self.min_samples = min_samples
        self.observed: deque[tuple[float, int]] = deque(maxlen=MAX_OBSERVED)
        self.in_order = True
        """Every arrival so far was observed no earlier than the one before it."""
        self.arrivals = 0
        """Arrivals observed so far (the deque holds the latest MAX_OBSERVED): with the time,
        it tells whether the lengths can have changed since they were last read."""

    def observe(self, now: float, input_tokens: int) -> None:
        """A request arrived at `now` (real seconds) with this routed length."""
        if self.observed and now < self.observed[-1][0]:
            self.in_order = False
        self.observed.append((now, input_tokens))
        self.arrivals += 1

    def since(self, cutoff: float) -> list[int]:
        """The lengths observed at or after `cutoff`, in arrival order. While arrivals were
        observed in time order (the sim's always are), the scan walks back from the newest and
        stops at the first older one instead of reading all MAX_OBSERVED (it ran at every
        re-plan); otherwise every arrival is looked at. The same list either way."""
        if not self.in_order:
            return [n for t, n in self.observed if t >= cutoff]
        return tail_since(self.observed, cutoff)

    def lengths(self, now: float) -> LengthDistribution:
        """The distribution to plan with at `now` (real seconds)."""
        if len(self.observed) < self.min_samples:
            return self.configured
        recent = self.since(now - self.window)
        if len(recent) < self.min_samples:  # a quiet spell: the latest arrivals still tell
            recent = [n for _, n in list(self.observed)[-self.min_samples :]]
        return EmpiricalLengths.of(recent)
