"""Sleeping to absolute deadlines, and measuring how honest the emulated timing was.

Emulated engines promise that work modelled to take T seconds (real) takes the clock's wall
equivalent of T (testbed.clock). asyncio wakes up late under load, so two things are measured:
- lateness of every wake-up against its deadline (what a single step can be off by);
- timing error of every operation (a prefill, a request's decode phase): |actual - modelled| /
  modelled. Deadlines are absolute, so wake-up lateness does not accumulate into drift, and the
  operation error is what a request's latency actually carries.
Both are reported in real-world units (converted by the run's clock) like everything else.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from testbed.clock import Clock, LiveClock

__all__ = ["TimingMeter", "exact_timing", "sleep_until"]


@dataclass
class TimingMeter:
    clock: Clock = field(default_factory=LiveClock)
    lateness: list[float] = field(default_factory=list)
    """Wall seconds each wake-up came after its deadline (capped sample count)."""
    modelled: float = 0.0
    error: float = 0.0
    operations: int = 0
    max_samples: int = 100_000

    def wake(self, lateness: float) -> None:
        if len(self.lateness) < self.max_samples:
            self.lateness.append(max(lateness, 0.0))

    def operation(self, actual: float, modelled: float) -> None:
        """One operation that should have taken `modelled` wall seconds took `actual`."""
        self.operations += 1
        self.modelled += modelled
        self.error += abs(actual - modelled)

    def stats(self) -> dict[str, float | int]:
        s = sorted(self.lateness)
        n = len(s)
        real = self.clock.real
        return {
            "steps": n,
            "operations": self.operations,
            "lateness_mean_s": real(sum(s) / n) if n else 0.0,
            "lateness_p99_s": real(s[min(n - 1, int(0.99 * n))]) if n else 0.0,
            "timing_error": (self.error / self.modelled) if self.modelled > 0 else 0.0,
        }


def exact_timing(steps: int, operations: int) -> dict[str, float | int]:
    """TimingMeter.stats for an engine whose time is modelled exactly (the sim's): no wake-up
    was late, no operation took other than its modelled time."""
    return {
        "steps": steps,
        "operations": operations,
        "lateness_mean_s": 0.0,
        "lateness_p99_s": 0.0,
        "timing_error": 0.0,
    }


async def sleep_until(deadline: float) -> float:
    """Sleep until time.monotonic() >= deadline; return how late we woke (wall seconds)."""
    delay = deadline - time.monotonic()
    if delay > 0:
        await asyncio.sleep(delay)
    return time.monotonic() - deadline
