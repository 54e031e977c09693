"""How late the router's event loop runs: a timer cannot fire while the loop is busy, so an HTTP
policy's deadline (testbed.policy.http_client) is only as sharp as this lag, and a run's report
gives its p99 next to the decision latencies.

A task sleeps LAG_INTERVAL_S again and again and keeps how much later than asked it woke up.
Cheap (20 wake-ups a second) and bounded: a uniform sample (reservoir) of at most LAG_KEEP
values, the count and the exact maximum, whatever the run's length.
"""

from __future__ import annotations

import asyncio
import random
from typing import Any

from testbed.policy.decider import wall_percentiles_ms

__all__ = ["LAG_INTERVAL_S", "LoopLag"]

LAG_INTERVAL_S = 0.05
LAG_KEEP = 8192
"""Samples kept: 6.8 minutes of them exactly, a uniform sample of a longer run."""


class LoopLag:
    """The router loop's wake-up lag (seconds), sampled by `run`."""

    def __init__(self, interval_s: float = LAG_INTERVAL_S, keep: int = LAG_KEEP) -> None:
        self.interval_s = interval_s
        self.keep = keep
        self.samples: list[float] = []
        self.n = 0
        self.max = 0.0
        self._rng = random.Random(0)

    def add(self, lag_s: float) -> None:
        lag_s = max(0.0, lag_s)
        self.n += 1
        self.max = max(self.max, lag_s)
        if len(self.samples) < self.keep:
            self.samples.append(lag_s)
        else:  # reservoir sampling: every sample so far kept with the same chance
            k = self._rng.randrange(self.n)
            if k < self.keep:
                self.samples[k] = lag_s

    async def run(self) -> None:
        """Sample until cancelled."""
        loop = asyncio.get_running_loop()
        while True:
            t0 = loop.time()
            await asyncio.sleep(self.interval_s)
            self.add(loop.time() - t0 - self.interval_s)

    def to_json(self) -> dict[str, Any] | None:
        """{n, p50, p90, p99, max} in milliseconds; None before the first sample."""
        if not self.n:
            return None
        out = wall_percentiles_ms(self.samples)
        out["n"], out["max"] = self.n, self.max * 1e3
        return out
