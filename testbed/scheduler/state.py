"""The scheduler's state: what its control loops decide, which the router reads.

The loops (scheduler.loops) write the routing threshold t, the bandwidth-scarcity verdict, the
link bandwidth estimate and the set of instances being drained; the router builds the policy's
snapshot from them. Every decision is also an event (`record`), kept in order and handed to
whoever listens (the router streams them to the runner, which puts them in the run's history).

A change of the policy inputs (t, scarce) is announced as a `policy` event too, but not kept:
it is state, and a listener that joins late asks for the current value (`policy_event`) instead
of replaying every change.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from testbed.clock import Clock

__all__ = ["POLICY", "SchedulerEvent", "SchedulerState"]

POLICY = "policy"
"""Kind of the event announcing new policy inputs (threshold_tokens, bandwidth_scarce)."""

Listener = Callable[["SchedulerEvent"], None]


@dataclass(frozen=True)
class SchedulerEvent:
    """One scheduler event, stamped on the clock of the process that made it."""

    seq: int
    """Position in the state's event order (1, 2, ...): a reader that reconnects asks for the
    events after the last one it saw."""
    t: float
    """Real-world seconds on the scheduler's clock."""
    kind: str
    data: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"seq": self.seq, "t": self.t, "kind": self.kind, **self.data}


class SchedulerState:
    """Threshold, scarcity, bandwidth estimate, draining set and events of one router."""

    def __init__(self, clock: Clock, threshold: float | None = None) -> None:
        self.clock = clock
        self.threshold = threshold
        """The routing threshold t (tokens) in force; None for policies without one."""
        self.scarce = False
        """The short-term loop's verdict: cross-datacenter bandwidth is scarce."""
        self.bandwidth_estimate: float | None = None
        """Real bytes/s of cross-datacenter bandwidth the short-term loop believes in."""
        self.link_in_flight: float | None = None
        """Real bytes the PrfaaS senders had sent or queued and not yet acknowledged, as of the
        short-term loop's last look (never negative); None until something measured it (no
        loop runs for the policy, or it has not sampled yet): 0 would read as an idle link."""
        self.link_delivered: float | None = None
        """Real bytes/s acknowledged over the short-term loop's last tick."""
        self.draining: set[str] = set()
        """Instances the long-term loop is emptying before a role switch: no new work."""
        self.events: list[SchedulerEvent] = []
        """Every decision so far, in order (policy changes are not kept: see the module)."""
        self._seq = 0
        self._listeners: list[Listener] = []

    @property
    def seq(self) -> int:
        """The number of the latest event (0 before the first)."""
        return self._seq

    @property
    def bandwidth_estimate_gbps(self) -> float | None:
        est = self.bandwidth_estimate
        return None if est is None else est * 8 / 1e9

    def record(self, kind: str, **data: Any) -> SchedulerEvent:
        """Keep a decision and hand it to the listeners."""
        event = self._next(kind, data)
        self.events.append(event)
        self._notify(event)
        return event

    def set_policy(self, threshold: float | None, scarce: bool) -> None:
        """Put new policy inputs in force; listeners hear of it when they changed."""
        changed = (threshold, scarce) != (self.threshold, self.scarce)
        self.threshold, self.scarce = threshold, scarce
        if changed:
            self._notify(self._next(POLICY, self.policy()))

    def policy(self) -> dict[str, Any]:
        """The policy inputs as the history records them."""
        return {
            "threshold_tokens": self.threshold,
            "bandwidth_scarce": self.scarce,
            "bandwidth_estimate_gbps": self.bandwidth_estimate_gbps,
        }

    def policy_event(self) -> SchedulerEvent:
        """The policy inputs in force now, as an event numbered like the latest one."""
        return SchedulerEvent(self._seq, self.clock.now(), POLICY, self.policy())

    def since(self, after: int) -> list[SchedulerEvent]:
        """The kept events numbered above `after`."""
        i = bisect.bisect_right(self.events, after, key=lambda e: e.seq)
        return self.events[i:]

    def listen(self, listener: Listener) -> Callable[[], None]:
        """Call `listener` with every event from now on; returns the call that stops it."""
        self._listeners.append(listener)

        def stop() -> None:
            if listener in self._listeners:
                self._listeners.remove(listener)

        return stop

    def _next(self, kind: str, data: dict[str, Any]) -> SchedulerEvent:
        self._seq += 1
        return SchedulerEvent(self._seq, self.clock.now(), kind, data)

    def _notify(self, event: SchedulerEvent) -> None:
        for listener in list(self._listeners):
            listener(event)
