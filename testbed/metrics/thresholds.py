"""The threshold a run routed by, and whose it was.

A built-in policy routes by the scheduler's threshold: the scenario's or the planner's t, moved
by the short-term loop, which every snapshot carries (the `policy` and `threshold` history
events). An outside policy (a plugin, an HTTP service) decides for itself and may route by a
threshold of its own, which it names on its routes (an HTTP answer's `route.threshold_tokens`,
kept on the request record); the scheduler's is then the one its fallback routes by. The
summary, the report and the timeline show the policy's own and label the scheduler's "fallback
threshold", so the one is never read as the other.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from testbed.metrics.history import events
from testbed.metrics.records import HistoryEvent, RequestRecord
from testbed.metrics.table import RecordTable

__all__ = ["own_thresholds", "policy_thresholds", "scheduler_thresholds", "threshold_lines"]


Steps = list[tuple[float, float]]
"""(real-world seconds, tokens), by time: a threshold from each time on."""


def scheduler_thresholds(
    history: Sequence[HistoryEvent], kinds: tuple[str, ...] = ("policy",)
) -> Steps:
    """The scheduler's threshold over the run: the history events of `kinds` that carry one
    (`policy`: each change announced; the timeline adds the loop's `threshold` decisions)."""
    return sorted(
        (e.t, float(e.data["threshold_tokens"]))
        for e in events(history, *kinds)
        if e.data.get("threshold_tokens") is not None
    )


def own_thresholds(records: Sequence[RequestRecord] | RecordTable) -> Steps:
    """(arrival, tokens) of every request the policy itself decided whose route named a
    threshold, by arrival: an outside policy's own threshold over the run (an HTTP answer's
    `route.threshold_tokens`, a plugin's `Route.threshold_tokens`)."""
    if isinstance(records, RecordTable):
        return records.own_thresholds()
    return sorted(
        (r.arrival, float(r.threshold_tokens))
        for r in records
        if r.decided_by == "policy" and r.threshold_tokens is not None
    )


def _stats(steps: Steps) -> dict[str, Any]:
    values = [v for _, v in steps]
    return {
        "samples": len(values),
        "min": min(values) if values else None,
        "max": max(values) if values else None,
        "last": values[-1] if values else None,
    }


def policy_thresholds(
    records: Sequence[RequestRecord] | RecordTable,
    history: Sequence[HistoryEvent],
    outside: bool = False,
) -> dict[str, Any]:
    """The summary's `policy_thresholds`: samples, min, max, last (tokens) of the threshold the
    policy routed by. A built-in's is the scheduler's; `outside` gives the policy's own
    (`own_thresholds`; samples 0 when its routes name none) and puts the scheduler's under
    `fallback`."""
    loop = scheduler_thresholds(history)
    if not outside:
        return _stats(loop)
    return {**_stats(own_thresholds(records)), "fallback": _stats(loop)}


def threshold_lines(
    records: Sequence[RequestRecord] | RecordTable, history: Sequence[HistoryEvent], outside: bool
) -> dict[str, tuple[Steps, str]]:
    """The timeline's threshold lines by legend label, with a matplotlib line style: the
    scheduler's as "threshold t" for a built-in; for an outside policy its own, solid, as
    "policy threshold" (none when its routes name none) and the scheduler's, dashed, as
    "fallback threshold"."""
    loop = scheduler_thresholds(history, ("threshold", "policy"))
    if not outside:
        return {"threshold t": (loop, "-")} if loop else {}
    lines: dict[str, tuple[Steps, str]] = {}
    own = own_thresholds(records)
    if own:
        lines["policy threshold"] = (own, "-")
    if loop:
        lines["fallback threshold"] = (loop, "--")
    return lines
