"""Arrival processes: when requests reach the router, in real-world seconds over [0, duration).

The paper assumes evenly spaced (`uniform`) arrivals; real traffic is not like that, and the point
of the testbed is to see what the scheduler does when it is not. So there are four processes, all
driven by a caller-supplied numpy Generator so a seed reproduces a run exactly:

- `poisson`: exponential gaps at `rate` (memoryless, the usual open-loop load model).
- `uniform`: one arrival every 1/rate seconds, starting at 0 (the paper's assumption).
- `gamma`: gamma-distributed gaps with mean 1/rate and squared coefficient of variation
  `burstiness` (1 is Poisson, >1 clumps arrivals together, <1 is smoother than Poisson).
- `onoff`: bursts. Arrivals happen only during ON windows of length `on`, none during the OFF
  windows of length `off` that follow; the ON rate is rate x (on + off) / on so that the long-run
  mean rate is still `rate`. Within ON it is Poisson. The run starts with an ON window.

Every function returns a sorted float64 array; the same Generator state gives the same array.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from testbed.config import ArrivalsConfig

__all__ = [
    "arrival_times",
    "gamma_arrivals",
    "onoff_arrivals",
    "onoff_windows",
    "poisson_arrivals",
    "uniform_arrivals",
]


def _check(rate: float, duration: float) -> None:
    if not rate > 0 or not math.isfinite(rate):
        raise ValueError(f"arrival rate must be a positive finite number, got {rate!r}")
    if not duration >= 0 or not math.isfinite(duration):
        raise ValueError(f"duration must be a non-negative finite number, got {duration!r}")


def _renewal(
    duration: float,
    mean_gap: float,
    draw: Callable[[int], np.ndarray],
    limit: int | None = None,
) -> np.ndarray:
    """Arrival times of a renewal process: cumulative sums of gaps, cut at `duration` (and
    after the first `limit`, when given).

    Gaps are drawn in chunks sized from the expected count (plus a margin) so a long run costs a
    few vectorised draws rather than a Python loop per request. Chunk sizes depend only on the
    arguments, so the draws (and the result) are a pure function of the Generator's state; a
    `limit` draws no more than it needs (the first n of a chunk are the same values a chunk of
    n gives), so the first `limit` arrivals are the same as without it.
    """
    expected = duration / mean_gap
    chunk = int(expected + 6.0 * math.sqrt(expected) + 16)
    if limit is not None:
        chunk = min(chunk, limit + 16)
    parts: list[np.ndarray] = []
    t = 0.0
    drawn = 0
    while t < duration and (limit is None or drawn < limit):
        times = t + np.cumsum(draw(chunk))
        parts.append(times)
        t = float(times[-1])
        drawn += chunk
    if not parts:
        return np.empty(0, dtype=np.float64)
    out = np.concatenate(parts)
    return out[out < duration][:limit]


def poisson_arrivals(
    rng: np.random.Generator, rate: float, duration: float, limit: int | None = None
) -> np.ndarray:
    """Poisson process at `rate` requests/s: independent exponential gaps of mean 1/rate."""
    _check(rate, duration)
    return _renewal(duration, 1.0 / rate, lambda n: rng.exponential(1.0 / rate, size=n), limit)


def uniform_arrivals(rate: float, duration: float, limit: int | None = None) -> np.ndarray:
    """Evenly spaced arrivals at 0, 1/rate, 2/rate, ... (the paper's assumption; no randomness)."""
    _check(rate, duration)
    n = math.ceil(duration * rate)
    out = np.arange(n if limit is None else min(n, limit), dtype=np.float64) / rate
    return out[out < duration]


def gamma_arrivals(
    rng: np.random.Generator,
    rate: float,
    duration: float,
    burstiness: float,
    limit: int | None = None,
) -> np.ndarray:
    """Renewal process with gamma gaps: mean 1/rate, squared coefficient of variation `burstiness`.

    A gamma with shape k and scale theta has mean k*theta and SCV 1/k, so k = 1/burstiness and
    theta = burstiness/rate. One parameter then sweeps from smooth (k large) through Poisson
    (k = 1) to very bursty (k small: many tiny gaps, a few long silences).
    """
    _check(rate, duration)
    if not burstiness > 0 or not math.isfinite(burstiness):
        raise ValueError(f"burstiness must be a positive finite number, got {burstiness!r}")
    shape, scale = 1.0 / burstiness, burstiness / rate
    return _renewal(duration, 1.0 / rate, lambda n: rng.gamma(shape, scale, size=n), limit)


def onoff_windows(duration: float, on: float, off: float) -> list[tuple[float, float]]:
    """The ON windows [start, end) of an on/off process within [0, duration), first one at 0."""
    if not on > 0 or not off >= 0:
        raise ValueError(f"on must be > 0 and off >= 0, got on={on!r} off={off!r}")
    period = on + off
    out: list[tuple[float, float]] = []
    k = 0
    while k * period < duration:
        start = k * period
        out.append((start, min(start + on, duration)))
        k += 1
    return out


def onoff_arrivals(
    rng: np.random.Generator,
    rate: float,
    duration: float,
    on: float,
    off: float,
    limit: int | None = None,
) -> np.ndarray:
    """Poisson bursts during ON windows only, at rate x (on + off) / on so the mean is `rate`.

    Draws one Poisson process on the concatenated ON time and maps it onto the wall clock: ON-time
    u falls in window k = floor(u / on) and lands at k x (on + off) + (u - k x on). That keeps
    arrivals strictly out of OFF windows without any rejection step.
    """
    _check(rate, duration)
    windows = onoff_windows(duration, on, off)
    on_time = sum(end - start for start, end in windows)
    if on_time <= 0:
        return np.empty(0, dtype=np.float64)
    on_rate = rate * (on + off) / on
    u = poisson_arrivals(rng, on_rate, on_time, limit)
    k = np.floor(u / on)
    out = k * (on + off) + (u - k * on)
    return out[out < duration]


def arrival_times(
    cfg: ArrivalsConfig,
    *,
    rate: float,
    duration: float,
    rng: np.random.Generator,
    limit: int | None = None,
) -> np.ndarray:
    """Arrival times for an `ArrivalsConfig` at an explicit rate (the caller resolves `load`),
    the first `limit` of them when given (drawing no more: `workload.max_requests`).

    `process: trace` has no synthetic arrivals; replaying a trace is `generate.generate_requests`.
    """
    if cfg.process == "poisson":
        return poisson_arrivals(rng, rate, duration, limit)
    if cfg.process == "uniform":
        return uniform_arrivals(rate, duration, limit)
    if cfg.process == "gamma":
        return gamma_arrivals(rng, rate, duration, cfg.burstiness, limit)
    if cfg.process == "onoff":
        return onoff_arrivals(rng, rate, duration, cfg.on_duration, cfg.off_duration, limit)
    raise ValueError(f"arrival process {cfg.process!r} has no synthetic arrival times")
