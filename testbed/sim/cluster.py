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
from dataclasses import dataclass

from testbed.clock import Clock, Scale
from testbed.metrics.records import HistoryEvent
from testbed.policy.base import Cluster as ClusterName
from testbed.policy.base import InstanceLoad, Snapshot
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
    ) -> None:
        self.loop = loop
        self.clock = clock
        self.instances: dict[str, SimInstance] = {i.id: i for i in instances}
        self.link = link
        self.state = state
        self.scale = scale
        self.health_interval = health_interval
        self.model = model
        self.healthy: dict[str, bool] = dict.fromkeys(self.instances, True)
        self.outstanding: dict[str, int] = dict.fromkeys(self.instances, 0)
        self.work: dict[str, float] = dict.fromkeys(self.instances, 0.0)
        self._watching: set[str] = set()
        self._loads: dict[str, InstanceLoad] = {}
        """Each instance's InstanceLoad as of its last change (a snapshot reuses them: a
        decision changes two instances' load, not all of them)."""

    # ------------------------------------------------------------------ load and health

    def charge(
        self, prefill: str | None, tokens: float, decode: str | None, out: float, sign: int
    ) -> None:
        if prefill is not None:
            self.outstanding[prefill] += sign
            self.work[prefill] += sign * tokens
            self._loads.pop(prefill, None)
        if decode is not None:
            self.outstanding[decode] += sign
            self.work[decode] += sign * out
            self._loads.pop(decode, None)

    def _load(self, i: SimInstance) -> InstanceLoad:
        load = self._loads.get(i.id)
        if load is None or load.role != i.role:
            load = self._loads[i.id] = InstanceLoad(
                i.id, i.cluster, i.role, self.outstanding[i.id], self.work[i.id]
            )
        return load

    def snapshot(self, exclude: frozenset[str] = frozenset()) -> Snapshot:
        """Load of every healthy instance not excluded nor draining (as the live router)."""
        draining = self.state.draining
        healthy, load = self.healthy, self._load
        return Snapshot(
            now=self.loop.time(),
            instances=tuple(
                load(i)
                for i in self.instances.values()
                if healthy[i.id]
                and i.id not in exclude
                and i.cluster not in exclude
                and i.id not in draining
            ),
            threshold_tokens=self.state.threshold,
            bandwidth_scarce=self.state.scarce,
        )

    def mark_down(self, iid: str) -> None:
        """Out of rotation; back once its health check answers (polled)."""
        self.healthy[iid] = False
        if iid not in self._watching:
            self._watching.add(iid)
            self.loop.call_later(self.health_interval, self._poll, iid)

    def _poll(self, iid: str) -> None:
        inst = self.instances[iid]
        if inst.alive and not inst.paused:
            self.healthy[iid] = True
            self._watching.discard(iid)
        else:
            self.loop.call_later(self.health_interval, self._poll, iid)

    # ------------------------------------------------------------------ scheduler.cluster.Cluster

    async def sender_stats(self, instance: str) -> SenderCounters | None:
        inst = self.instances[instance]
        if not inst.alive or inst.paused or self.link is None:
            return None  # a dead or stopped worker does not answer /stats
        wire = self.scale.wire_bytes
        return SenderCounters(
            bytes_acked=wire(self.link.acked(instance)),
            in_flight_bytes=wire(self.link.in_queue(instance)),
            queued_bytes=0.0,
        )

    async def switch_role(self, instance: str, role: Role, switch_s: float) -> bool:
        inst = self.instances[instance]
        if not inst.switchable or not inst.alive:
            return False
        await self.clock.sleep(switch_s)
        inst.role = role
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
