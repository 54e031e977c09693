"""The router's side of the sim: the instances, their health and load accounting, the policy's
snapshot, and the `scheduler.cluster.Cluster` the shared control loops read and write.

It keeps the same accounting as the live router (services.router.dispatch.RouterState): one
outstanding count and one work figure per instance, charged when an attempt is dispatched and
released when its prefill answers (prefill) or its decode ends (decode); an instance that failed
an attempt is out of rotation until its health check answers again, polled every
HEALTH_INTERVAL_S of the live router's wall time (converted at the scenario's time_scale, so
faults are noticed as late as live).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from testbed.clock import Clock, Scale
from testbed.dispatch import core
from testbed.metrics.records import HistoryEvent
from testbed.policy.base import Cluster as ClusterName
from testbed.policy.base import Snapshot
from testbed.policy.book import BookEntry, LoadBook
from testbed.profiles import ModelProfile
from testbed.scheduler.cluster import Role, SenderCounters
from testbed.scheduler.state import POLICY, SchedulerEvent, SchedulerState
from testbed.sim.instances import SimDecode, SimPrefill
from testbed.sim.link import SimLink

__all__ = ["SimCluster", "SimInstance"]


@dataclass(eq=False)
class SimInstance:
    """One instance as the router sees it (`scheduler.cluster.InstanceView`), with its engines:
    a switchable PD instance has both and serves `role`."""

    id: str
    cluster: ClusterName
    role: Role
    switchable: bool
    prefill: SimPrefill | None
    decode: SimDecode | None

    @property
    def alive(self) -> bool:
        eng = self.prefill or self.decode
        return eng is not None and eng.alive

    @property
    def paused(self) -> bool:
        eng = self.prefill or self.decode
        return eng is not None and eng.paused_at is not None

    @property
    def answers(self) -> bool:
        """Whether the worker answers /health and /stats: running and not stopped. The one
        rule for the health poll and the short-term loop's sender counters."""
        return self.alive and not self.paused

    def engines(self) -> list[SimPrefill | SimDecode]:
        return [e for e in (self.prefill, self.decode) if e is not None]


class SimCluster:
    """Instances, health, load and the scheduler state of one simulated router."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        clock: Clock,
        instances: list[SimInstance],
        link: SimLink | None,
        state: SchedulerState,
        scale: Scale,
        health_interval: float,
        model: ModelProfile,
        hardware: Mapping[str, str] | None = None,
        rtt_s: float | None = None,
    ) -> None:
        self.loop = loop
        self.clock = clock
        self.instances: dict[str, SimInstance] = {i.id: i for i in instances}
        self.link = link
        self.state = state
        self.scale = scale
        self.health_interval = health_interval
        self.model = model
        hw = dict(hardware or {})
        self.book = LoadBook(
            (
                BookEntry(i.id, i.cluster, i.role, (hardware or {}).get(i.cluster))
                for i in instances
            ),
            state.draining,
            core.cost_model(model, hw),
        )
        """The same load accounting as the live router's (testbed.policy.book)."""
        self.healthy = self.book.healthy
        self.outstanding = self.book.outstanding
        self.work = self.book.work
        self.rtt_s = rtt_s
        self._watching: set[str] = set()

    # ------------------------------------------------------------------ load and health

    def snapshot(self, exclude: frozenset[str] = frozenset()) -> Snapshot:
        """The policy's view (dispatch.core.snapshot, as the live router's)."""
        has_link = self.link is not None
        return core.snapshot(self.book, self.state, self.loop.time(), self.rtt_s, has_link, exclude)

    def mark_down(self, iid: str) -> None:
        """Out of rotation; back once its health check answers (polled)."""
        self.book.set_healthy(iid, False)
        if iid not in self._watching:
            self._watching.add(iid)
            self.loop.call_later(self.health_interval, self._poll, iid)

    def _poll(self, iid: str) -> None:
        inst = self.instances[iid]
        if inst.answers:
            self.book.set_healthy(iid, True)
            self._watching.discard(iid)
        else:
            self.loop.call_later(self.health_interval, self._poll, iid)

    # ------------------------------------------------------------------ scheduler.cluster.Cluster

    async def sender_stats(self, instances: Sequence[str]) -> list[SenderCounters | None]:
        """Each sender's counters from the link's flows, None for a dead or stopped worker
        (it does not answer /stats); in one loop: the short-term loop asks every tick."""
        link, wire, known = self.link, self.scale.wire_bytes, self.instances
        out: list[SenderCounters | None] = []
        for iid in instances:
            if link is None or not known[iid].answers:
                out.append(None)
                continue
            acked, in_queue = link.counters(iid)
            out.append(SenderCounters(wire(acked), wire(in_queue), 0.0))
        return out

    async def switch_role(self, instance: str, role: Role, switch_s: float) -> bool:
        inst = self.instances[instance]
        if not inst.switchable or not inst.alive:
            return False
        await self.clock.sleep(switch_s)
        inst.role = role
        self.book.set_role(instance, role)
        return True


def scheduler_history(state: SchedulerState, history: list[HistoryEvent]) -> None:
    """Put the scheduler's events in the run's history as they happen, as the live runner
    does from the router's event stream: a policy event only when its inputs changed."""
    last: list[tuple[object, object]] = [(state.threshold, state.scarce)]

    def listener(event: SchedulerEvent) -> None:
        data = dict(event.data)
        if event.kind == POLICY:
            policy = (data.get("threshold_tokens"), data.get("bandwidth_scarce"))
            if policy == last[0]:
                return
            last[0] = policy
        history.append(HistoryEvent(event.t, event.kind, data))

    state.listen(listener)
