"""The run's periodic samples as history events, made one way for live and sim runs: the queue
depth of every instance, the link's carried bytes and rate, each engine's timing statistics.

The live runner reads them from the router's /stats, the link emulator or the kernel, and the
workers' /stats; the sim from its models. What an event holds and how a rate is computed from
two readings is written here once, so the summaries and the timeline read both alike.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from testbed.metrics.records import HistoryEvent

__all__ = [
    "ENGINE",
    "LINK",
    "QUEUE",
    "SAMPLE_INTERVAL_S",
    "LinkRate",
    "engine_event",
    "link_event",
    "queue_events",
]

SAMPLE_INTERVAL_S = 0.25
"""Wall seconds between the live runner's queue and link samples; the sim samples as often in
real-world time (x the scenario's time_scale), so both histories have the same density."""
QUEUE = "queue"
LINK = "link"
ENGINE = "engine"


def queue_events(t: float, instances: Iterable[tuple[str, str, str, float]]) -> list[HistoryEvent]:
    """Each instance's outstanding requests (the router's count) at `t`, from its (instance,
    cluster, role, depth); one call per sample (the sim samples 1,248 instances four times a
    simulated second at 10K GPUs)."""
    return [
        HistoryEvent(t, QUEUE, {"instance": i, "cluster": c, "role": r, "depth": d})
        for i, c, r, d in instances
    ]


class LinkRate:
    """The link's rate between two readings of its carried bytes, per second of the readings'
    clock (the caller converts to real-world Gbit/s); 0 for the first reading or one taken at
    the same time as the last."""

    def __init__(self) -> None:
        self._last: tuple[float, float] | None = None

    def __call__(self, at: float, carried: float) -> float:
        rate = 0.0
        if self._last is not None and at > self._last[0]:
            rate = (carried - self._last[1]) / (at - self._last[0])
        self._last = (at, carried)
        return rate


def link_event(t: float, wire_bytes: float, gbps: float, configured_gbps: float) -> HistoryEvent:
    """The link at `t`: bytes carried so far (wire), its rate since the last sample and the cap
    in force (real-world Gbit/s)."""
    return HistoryEvent(
        t, LINK, {"wire_bytes": wire_bytes, "gbps": gbps, "configured_gbps": configured_gbps}
    )


def engine_event(t: float, instance: str, stats: Mapping[str, Any]) -> HistoryEvent:
    """An instance's engine statistics (engine.timing.TimingMeter.stats) at the run's end."""
    return HistoryEvent(t, ENGINE, {"instance": instance, **stats})
