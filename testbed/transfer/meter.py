"""Rate and RTT meters for the sender's stats: cheap to update per frame, read on demand.

The router polls sender stats a few times a second while frames go out ~1000 times a second, so
updates are O(1) and the work of turning counts into rates happens when stats are read. The clock
is injected (default `time.monotonic`) so the meters are testable and simulator-friendly.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable

__all__ = ["RateMeter", "RttTracker"]

Clock = Callable[[], float]


class RateMeter:
    """Bytes per second two ways: an exponentially weighted average and a sliding window.

    The EWMA (time constant `tau`) is a smooth signal for control loops; the window (`window`
    seconds) is an honest "what happened lately" for reports. Both decay to zero when idle.
    """

    __slots__ = (
        "_bucket",
        "_buckets",
        "_clock",
        "_ewma",
        "_last",
        "_pending",
        "_tau",
        "_tick",
        "_window",
        "_window_sum",
        "total",
    )

    def __init__(
        self,
        *,
        tau: float = 1.0,
        window: float = 1.0,
        tick: float = 0.05,
        clock: Clock = time.monotonic,
    ) -> None:
        if tau <= 0 or window <= 0 or tick <= 0:
            raise ValueError("tau, window and tick must be positive")
        self._tau, self._window, self._tick, self._clock = tau, window, tick, clock
        self._bucket = min(tick, window / 10)
        self._last = clock()
        self._pending = 0
        self._ewma = 0.0
        self._buckets: deque[list[float]] = deque()  # [bucket start time, bytes]
        self._window_sum = 0.0
        self.total = 0

    def add(self, n: int) -> None:
        now = self._clock()
        self.total += n
        self._pending += n
        b = self._buckets
        if b and now - b[-1][0] < self._bucket:
            b[-1][1] += n
        else:
            b.append([now, float(n)])
        self._window_sum += n
        if now - self._last >= self._tick:
            self._fold(now)

    def _fold(self, now: float) -> None:
        dt = now - self._last
        if dt <= 0:
            return
        inst = self._pending / dt
        self._ewma += (1.0 - math.exp(-dt / self._tau)) * (inst - self._ewma)
        self._pending = 0
        self._last = now

    def ewma(self) -> float:
        """Smoothed rate in bytes/s (updated at most every `tick` seconds)."""
        now = self._clock()
        if now - self._last >= self._tick:
            self._fold(now)
        return self._ewma

    def windowed(self) -> float:
        """Bytes sent in the last `window` seconds divided by `window`."""
        cutoff = self._clock() - self._window
        b = self._buckets
        while b and b[0][0] < cutoff:
            self._window_sum -= b.popleft()[1]
        if not b:
            self._window_sum = 0.0  # drop accumulated float error
        return max(0.0, self._window_sum) / self._window


class RttTracker:
    """Round-trip samples (send -> ACK): last, smoothed (TCP-style 1/8 gain), recent min/max."""

    __slots__ = ("_recent", "count", "last", "srtt")

    def __init__(self, recent: int = 128) -> None:
        self._recent: deque[float] = deque(maxlen=recent)
        self.count = 0
        self.last = math.nan
        self.srtt = math.nan

    def add(self, rtt: float) -> None:
        self.count += 1
        self.last = rtt
        self.srtt = rtt if math.isnan(self.srtt) else self.srtt + (rtt - self.srtt) / 8.0
        self._recent.append(rtt)

    def recent_min(self) -> float:
        return min(self._recent) if self._recent else math.nan

    def recent_max(self) -> float:
        return max(self._recent) if self._recent else math.nan
