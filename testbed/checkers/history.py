"""Reading faults back from a run's history: when each was in force, and why one never was."""

from __future__ import annotations

import math
from collections.abc import Sequence

from testbed.metrics.records import HistoryEvent

__all__ = ["fault_windows", "not_applied"]


def fault_windows(history: Sequence[HistoryEvent], action: str) -> list[tuple[float, float, str]]:
    """(start, end, target) of every applied fault of this action; end is inf if never ended."""
    starts: dict[object, HistoryEvent] = {}
    ends: dict[object, float] = {}
    for e in sorted(history, key=lambda e: e.t):
        if e.kind != "fault" or e.data.get("action") != action or "error" in e.data:
            continue
        key = e.data.get("index")
        if e.data.get("phase") == "start":
            starts.setdefault(key, e)
        elif e.data.get("phase") == "end":
            ends.setdefault(key, e.t)
    return [
        (e.t, ends.get(k, math.inf), str(e.data.get("target") or ""))
        for k, e in sorted(starts.items(), key=lambda kv: kv[1].t)
    ]


def not_applied(history: Sequence[HistoryEvent], action: str) -> str:
    """Why no `action` fault has a window: it was never started (the run ended or was
    interrupted first) or every attempt to apply it failed (its error)."""
    errors = [
        str(e.data["error"])
        for e in history
        if e.kind == "fault"
        and e.data.get("action") == action
        and e.data.get("phase") == "start"
        and "error" in e.data
    ]
    if errors:
        return f"the {action!r} fault failed to apply ({errors[0]}): it exercised nothing"
    return f"no {action!r} fault was applied in this run: it exercised nothing"
