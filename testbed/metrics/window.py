"""Window metrics: what a run's records say over a stretch of it (issue #37: one place).

- the **steady window** of a run: its last five sixths. The first sixth is skipped because
  queues are still filling and the first decodes have not finished, so completions there
  under-count what the deployment sustains;
- the **completion rate** over a window: requests whose last token fell in [lo, hi], per
  real-world second. Over the steady window of a run offered more than it can take (120% of
  lambda_max) it is the run's saturation throughput (the method of bench/fidelity.py and
  `testbed sweep`);
- the **TTFT percentile over a window**: the q-th percentile (linear) of the TTFTs of requests
  that arrived in [lo, hi) and have a first token; a request without one does not count (the
  scorecard's objective, testbed.metrics.scorecard.window_percentile, counts a failure as
  infinite instead: a verdict must see a loss, a latency figure must not be swallowed by one);
- the **backlog** at an instant: arrived and not yet completed.

Every figure is in real-world seconds, as records carry them.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence

import numpy as np

from testbed.metrics.records import RequestRecord

__all__ = [
    "STEADY_SKIP",
    "backlog",
    "completion_rate",
    "in_window",
    "percentile",
    "steady_window",
    "ttft_p90",
    "ttft_percentile",
]

STEADY_SKIP = 1 / 6
"""The share of a run, from its start, the steady window leaves out."""


def steady_window(duration_s: float) -> tuple[float, float]:
    """(lo, hi) of the steady window of a run of `duration_s`: its last five sixths."""
    return duration_s * STEADY_SKIP, duration_s


def completion_rate(records: Iterable[RequestRecord], lo: float, hi: float) -> float:
    """Requests completed with their last token in [lo, hi], per second of the window."""
    ends = sorted(r.last_token for r in records if r.status == "completed" and r.last_token)
    return (bisect.bisect_right(ends, hi) - bisect.bisect_left(ends, lo)) / (hi - lo)


def in_window(records: Iterable[RequestRecord], lo: float, hi: float) -> list[RequestRecord]:
    """The requests that arrived in [lo, hi)."""
    return [r for r in records if lo <= r.arrival < hi]


def percentile(values: Sequence[float], q: float = 90.0) -> float | None:
    """The q-th percentile (linear interpolation) of `values`; None for none."""
    return float(np.percentile(values, q)) if len(values) else None


def ttft_percentile(
    records: Iterable[RequestRecord], lo: float, hi: float, q: float = 90.0
) -> float | None:
    """The q-th percentile of TTFT over requests that arrived in [lo, hi) with a first token."""
    return percentile([r.ttft for r in in_window(records, lo, hi) if r.ttft is not None], q)


def ttft_p90(records: Iterable[RequestRecord], lo: float, hi: float) -> float | None:
    """P90 TTFT over the window [lo, hi) of arrivals (see `ttft_percentile`)."""
    return ttft_percentile(records, lo, hi, 90.0)


def backlog(records: Sequence[RequestRecord], t: float) -> int:
    """Requests arrived by `t` and not completed by then."""
    arrived = sum(1 for r in records if r.arrival <= t)
    done = sum(1 for r in records if r.status == "completed" and (r.last_token or 1e18) <= t)
    return arrived - done
