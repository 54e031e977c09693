"""The scheduler's control loops: the short-term threshold loop and the long-term role loop.

Both feed pure controllers (`scheduler.shortterm`, `scheduler.longterm`) with what the running
system shows and put their decisions in the scheduler's state (`scheduler.state`), which the
router reads; every decision (and the signals behind it) is an event of that state, which the
router streams into the run's history.

What they see of the router is `scheduler.cluster.Cluster`: the instances, the router's load
accounting and two calls (a sender's counters, a role switch). They never import a service.

The planner's workload input is the *observed* input lengths of the requests that arrived in the
last `long_term.window` (`short_term` uses the same window), once there are `min_samples` of
them; before that, the scenario's configured distribution (`scheduler.observed`). That is what
lets t and the PD split follow a shift in traffic rather than the distribution the run was
started with.
"""

from __future__ import annotations

import asyncio
import math
from collections import deque

from testbed.clock import Clock, Scale
from testbed.config import LongTermConfig
from testbed.planner import PlanInputs, SplitSearch, StagePlan, plan_deployment
from testbed.profiles import MODELS
from testbed.scheduler.balance import QueueBalance
from testbed.scheduler.bandwidth import LinkEstimator, LinkSample
from testbed.scheduler.cluster import Cluster, InstanceView, Role
from testbed.scheduler.longterm import LongTermController, StagePressure
from testbed.scheduler.observed import MAX_OBSERVED, ObservedLengths, tail_since
from testbed.scheduler.shortterm import ThresholdController
from testbed.scheduler.spec import SchedulerSpec
from testbed.scheduler.state import SchedulerState
from testbed.workload.build import length_distribution
from testbed.workload.lengths import LengthDistribution

__all__ = ["DRAIN_POLL_S", "ControlLoops"]

DRAIN_POLL_S = 0.05
"""Wall seconds between looks at a draining instance's outstanding count."""


class ControlLoops:
    """The loops of one router: `run_short_term` and, with `long_term` set, `run_long_term`."""

    def __init__(
        self,
        spec: SchedulerSpec,
        cluster: Cluster,
        state: SchedulerState,
        clock: Clock,
        scale: Scale,
    ) -> None:
        self.sch = spec
        self.cluster = cluster
        self.state = state
        self.clock = clock
        self.scale = scale
        self.dep = spec.deployment
        self.model = MODELS[self.dep.model]
        self.short = spec.short_term
        self.long = spec.long_term
        defaults = LongTermConfig()
        self.window = (self.long or defaults).window
        self.arrived = ObservedLengths(
            length_distribution(spec.lengths), self.window, (self.long or defaults).min_samples
        )
        self.observe = self.arrived.observe
        """A request arrived (`ObservedLengths.observe`; the router calls it per request)."""
        self._inputs: tuple[tuple[float, int], PlanInputs] | None = None
        """The planner's inputs with the (time, arrivals) they were read at: both loops plan
        at the same instant every `window` and share them."""
        self._search: SplitSearch | None = None
        """The long-term loop's latest check's search, which a short-term re-plan at the same
        instant with the same inputs and bandwidth asks instead of searching again."""
        self.n_prefill = spec.n_prefill
        self.estimator = LinkEstimator(self.dep.link.bandwidth)
        self.ctl: ThresholdController | None = None
        self.balance = (
            QueueBalance(self.short.balance_margin, self.short.balance_step, self.short.max_bias)
            if self.short.queue_balance
            else None
        )
        self.converting = False
        self.predrained: set[str] = set()
        """Instances the long-term loop drains ahead of a conversion it is heading for."""
        self.estimates: deque[tuple[float, float]] = deque(maxlen=MAX_OBSERVED)
        """(real time, bandwidth estimate) of every short-term tick."""
        self.pressure_samples: list[StagePressure] = []
        """Stage pressure sampled every short-term tick, averaged per long-term check: one
        instantaneous queue reading is too noisy to act on."""
        self.bs_max = self.model.decode[self.dep.local.hardware].bs_max(spec.tpot_slo_s)
        local = self.dep.local.hardware
        self.hardware = {
            "prfaas": self.dep.prfaas.hardware if self.dep.prfaas is not None else local,
            "local": local,
        }
        """Each cluster's prefill hardware."""
        self.prefill_curves = {
            name: self.model.prefill.get(hw) for name, hw in self.hardware.items()
        }
        """Each cluster's T_prefill curve, None if the model has none for its hardware
        (`stage_loads` reads them every tick)."""

    # ------------------------------------------------------------------ inputs

    def lengths(self) -> LengthDistribution:
        """The observed lengths to plan with now (`ObservedLengths.lengths`)."""
        return self.arrived.lengths(self.clock.now())

    def inputs(self) -> PlanInputs:
        """The planner's inputs now: the same object until time moves or a request arrives
        (the short-term loop's workload refresh falls on a long-term check every `window`)."""
        at = (self.clock.now(), self.arrived.arrivals)
        read = self._inputs
        if read is None or read[0] != at:
            sch = self.sch
            lengths = self.lengths()
            read = self._inputs = (
                at,
                PlanInputs(lengths, sch.output_tokens, sch.tpot_slo_s, sch.threshold_step),
            )
        return read[1]

    def bandwidth(self) -> float:
        est = self.state.bandwidth_estimate
        return est if est is not None else self.dep.link.bandwidth

    def sustained_bandwidth(self) -> float:
        """The most the link offered over the long-term loop's sustain window: a split is
        re-planned for a narrow link only once it has been narrow that long (a drop the
        short-term loop can ride out never converts an instance)."""
        assert self.long is not None
        since = self.clock.now() - self.long.sustain * self.long.interval
        recent = tail_since(self.estimates, since)  # the short-term loop's, in time order
        if not recent or self.estimates[0][0] > since:  # not watched that long yet: nominal
            return max([self.dep.link.bandwidth, *recent])
        return max(recent)

    def plan(self, bandwidth: float, n_prefill: int | None, inputs: PlanInputs) -> StagePlan:
        """`plan_deployment` for the prfaas-pd deployment; the long-term check's search answers
        if it was made from these very inputs and bandwidth (`SplitSearch.plan(n)` is
        `plan_deployment(..., n_prefill=n)` exactly)."""
        search = self._search
        if search is not None and search.args[2] is inputs and search.args[3] == bandwidth:
            return search.plan(n_prefill)
        return plan_deployment(
            "prfaas-pd", self.dep, inputs, link_bytes_per_s=bandwidth, n_prefill=n_prefill
        )

    # ------------------------------------------------------------------ short-term loop

    async def sample_link(self, senders: list[str]) -> LinkSample | None:
        """The counters of the PrfaaS senders (ids) now, in real-world bytes; None if none
        answered. Both sums in one pass, left to right (sum()'s order before Python 3.12): the
        short-term loop samples every tick."""
        acked: float = 0
        queue: float = 0
        answered = False
        for x in await self.cluster.sender_stats(senders):
            if x is not None:
                answered = True
                acked += x.bytes_acked
                queue += x.in_flight_bytes + x.queued_bytes
        if not answered:
            return None
        real = self.scale.real_bytes
        # bytes waiting for the sender's window are as much a queue as bytes in flight; never
        # below 0 (a counter's float residue would read as a negative queue)
        inflight = real(queue)
        return LinkSample(self.clock.now(), real(acked), 0.0 if inflight < 0.0 else inflight)

    def senders(self) -> list[str]:
        """The PrfaaS instances' ids: their KV senders' counters are the link's."""
        return [i.id for i in self.cluster.instances.values() if i.cluster == "prfaas"]

    async def run_link_view(self) -> None:
        """Only measure the link (`spec.replans` False): for a policy that reads the snapshot's
        link without re-planning, the link view follows the senders' counters every
        `interval` while the threshold stays the scenario's and no event is recorded. Nothing
        is assumed before it is measured: bytes in flight are None until the first sample,
        the bandwidth estimate and the delivered rate until the second (a rate needs two)."""
        state, estimator = self.state, self.estimator
        senders = self.senders()
        while True:
            await self.clock.sleep(self.short.interval)
            sample = await self.sample_link(senders)
            if sample is None:
                continue
            estimate = estimator.update(sample)
            state.link_in_flight = sample.inflight_bytes
            state.link_delivered = estimator.delivered
            state.bandwidth_estimate = None if estimator.delivered is None else estimate

    async def run_short_term(self) -> None:
        """Estimate the link from the PrfaaS senders; re-plan t when the estimate moves, and
        every `window` anyway (the observed lengths move too). With `spec.replans` False,
        only the link is measured (`run_link_view`)."""
        if not self.sch.replans:
            await self.run_link_view()
            return
        state, st, cluster = self.state, self.short, self.cluster

        def plan_t(bandwidth: float) -> StagePlan:
            return self.plan(bandwidth, self.n_prefill, self.inputs())

        self.ctl = await asyncio.to_thread(
            ThresholdController,
            plan_t,
            self.dep.link.bandwidth,
            st.replan_change,
            st.min_t_change,
            st.cooldown,
            st.scarce_utilisation,
        )
        ctl = self.ctl
        # the loop plans from the configured link until it has measured one: that starting
        # belief (nominal bandwidth, an empty link) is what the snapshot shows meanwhile
        state.bandwidth_estimate = self.estimator.estimate
        state.link_in_flight = 0.0
        state.set_policy(ctl.threshold, ctl.scarce)
        state.record("threshold", threshold_tokens=ctl.threshold, scarce=ctl.scarce, why="start")
        senders = self.senders()
        last_refresh = self.clock.now()
        recorded = ctl.threshold
        while True:
            await self.clock.sleep(st.interval)
            sample = await self.sample_link(senders)
            if sample is None:
                continue
            estimate = self.estimator.update(sample)
            state.bandwidth_estimate = estimate
            state.link_in_flight = sample.inflight_bytes
            state.link_delivered = self.estimator.delivered
            self.estimates.append((sample.t, estimate))
            pressure, (w_prfaas, w_local) = self.stage_loads()
            self.pressure_samples.append(pressure)
            if not any(map(cluster.healthy.__getitem__, senders)):
                continue
            if sample.t - last_refresh >= self.window:
                last_refresh = sample.t
                decision = await asyncio.to_thread(ctl.replan, sample.t, estimate)
                why = "workload refresh"
            elif ctl.moved(estimate):
                decision = await asyncio.to_thread(ctl.update, sample.t, estimate)
                why = "bandwidth moved"
            else:  # nothing to plan: no thread for an unchanged decision
                decision = ctl.kept()
                why = "bandwidth moved"
            if self.balance is not None:
                self.balance.update(w_prfaas, w_local)
            self.apply(decision.threshold_tokens, decision.scarce)
            threshold = state.threshold
            assert threshold is not None
            moved = abs(threshold - recorded) > st.min_t_change * recorded
            if decision.changed or moved:
                recorded = threshold
                state.record(
                    "threshold",
                    threshold_tokens=threshold,
                    planned_tokens=decision.threshold_tokens,
                    bias=self.balance.bias if self.balance is not None else 1.0,
                    scarce=decision.scarce,
                    bandwidth_gbps=estimate * 8 / 1e9,
                    inflight_bytes=sample.inflight_bytes,
                    wait_prfaas_s=w_prfaas,
                    wait_local_s=w_local,
                    why=why if decision.changed else "queue balance",
                )

    def apply(self, planned: float, scarce: bool) -> None:
        """Put the planner's t, corrected by the queue balance, in force."""
        bias = self.balance.bias if self.balance is not None else 1.0
        self.state.set_policy(planned * bias, scarce)

    def waits(self) -> tuple[float, float]:
        """Expected prefill wait (real seconds) of a new request on each route: the least
        loaded prefill instance's outstanding requests x the profile's prefill time of their
        mean length. PrfaaS requests stay outstanding until their KV is acknowledged, so a
        queue on the link shows here too."""
        return self.stage_loads()[1]

    # ------------------------------------------------------------------ long-term loop

    def pressure(self) -> StagePressure:
        """Each stage's outstanding work per instance (`StagePressure`), now."""
        return self.stage_loads()[0]

    def stage_loads(self) -> tuple[StagePressure, tuple[float, float]]:
        """`pressure()` and `waits()` (PrfaaS, then PD-P) in one pass over the instances in
        rotation: the short-term loop reads both every tick."""
        cluster, curves = self.cluster, self.prefill_curves
        healthy, draining = cluster.healthy, self.state.draining
        outstanding, work = cluster.outstanding, cluster.work
        least: dict[str, float] = {}
        n_pre = n_dec = sum_pre = sum_dec = 0
        for i in cluster.instances.values():
            iid = i.id
            if not healthy[iid] or iid in draining:
                continue
            role, n = i.role, outstanding[iid]
            if role == "prefill":
                n_pre += 1
                sum_pre += n
                name = i.cluster
                if name in curves:
                    wait = 0.0
                    if n:  # n x `ModelProfile.prefill_time` of the mean, written out
                        tokens = work[iid] / n
                        if not tokens <= 0:
                            curve = curves[name]
                            if curve is None:
                                raise KeyError(self.hardware[name])
                            s = curve(tokens)
                            wait = n * (0.0 if s < 0.0 else s)
                    best = least.get(name)
                    if best is None or wait < best:  # min(): the first of equal waits
                        least[name] = wait
            elif role == "decode":
                n_dec += 1
                sum_dec += n
        pressure = StagePressure(
            prefill=sum_pre / n_pre if n_pre else math.inf,
            decode=sum_dec / (n_dec * self.bs_max) if n_dec else math.inf,
        )
        return pressure, (least.get("prfaas", math.inf), least.get("local", math.inf))

    async def run_long_term(self) -> None:
        """Every `interval`, ask the long-term controller whether the PD split should change;
        convert instances when it says so (drain, switch role, re-plan t)."""
        assert self.long is not None
        lt = self.long
        controller: LongTermController | None = None
        last_reason = ""
        while True:
            await self.clock.sleep(lt.interval)
            if self.converting:
                continue
            inputs, bandwidth = self.inputs(), self.sustained_bandwidth()
            # one grid for the check's questions (the free split, the running one, the target)
            search = SplitSearch("prfaas-pd", self.dep, inputs, link_bytes_per_s=bandwidth)
            self._search = search

            def plan_split(n: int | None, search: SplitSearch = search) -> StagePlan:
                return search.plan(n)

            if controller is None:
                controller = LongTermController(
                    plan_split,
                    self.sch.n_local,
                    min_gain=lt.min_gain,
                    sustain=lt.sustain,
                    pressure=lt.pressure,
                    predrain=lt.predrain,
                )
            controller.plan = plan_split
            samples, self.pressure_samples = self.pressure_samples or [self.pressure()], []
            pressure = StagePressure(
                prefill=sum(p.prefill for p in samples) / len(samples),
                decode=sum(p.decode for p in samples) / len(samples),
            )
            decision = await asyncio.to_thread(controller.update, self.n_prefill, pressure)
            if decision.reason != last_reason or decision.act:
                last_reason = decision.reason
                self.state.record(
                    "split_check",
                    current_prefill=decision.current_prefill,
                    target_prefill=decision.target_prefill,
                    gain=decision.gain,
                    act=decision.act,
                    reason=decision.reason,
                    bandwidth_gbps=bandwidth * 8 / 1e9,
                    mean_input_tokens=inputs.lengths.mean(),
                    prefill_pressure=pressure.prefill,
                    decode_pressure=pressure.decode,
                )
            if decision.act:
                await self.convert(decision.target_prefill)
            elif decision.prepare:
                self.drain_ahead(decision.target_prefill, decision.prepare)
            else:
                self.release_ahead("streak broken")

    def _candidates(self, shrink: str) -> list[InstanceView]:
        """Instances that may leave `shrink`: those already drained ahead first, then the least
        loaded (they empty soonest)."""
        cluster = self.cluster
        return sorted(
            (
                i
                for i in cluster.instances.values()
                if i.switchable and i.role == shrink and cluster.healthy[i.id]
            ),
            key=lambda i: (
                i.id not in self.predrained,
                cluster.work[i.id],
                cluster.outstanding[i.id],
                i.id,
            ),
        )

    def drain_ahead(self, target_prefill: int, count: int) -> None:
        """Start draining `count` instances of the shrinking role before the conversion is
        decided: they take no new work, and what they hold (decodes whose prefill is still
        queued elsewhere) leaves them while the streak completes."""
        shrink = "decode" if target_prefill > self.n_prefill else "prefill"
        chosen = {i.id for i in self._candidates(shrink)[:count]}
        if chosen == self.predrained:
            return
        self.release_ahead("target moved", keep=chosen)
        added = sorted(chosen - self.predrained)
        self.predrained = chosen
        self.state.draining.update(chosen)
        if added:
            self.state.record("drain_ahead", instances=added, role=shrink)

    def release_ahead(self, why: str, keep: set[str] | frozenset[str] = frozenset()) -> None:
        """Put instances drained ahead back into rotation (the conversion is off)."""
        back = sorted(self.predrained - keep)
        if not back:
            return
        self.state.draining.difference_update(back)
        self.predrained -= set(back)
        self.state.record("drain_released", instances=back, why=why)

    async def convert(self, target_prefill: int) -> None:
        """Move local PD instances between roles until `target_prefill` serve prefill."""
        cluster, state = self.cluster, self.state
        grow: Role = "prefill" if target_prefill > self.n_prefill else "decode"
        shrink = "decode" if grow == "prefill" else "prefill"
        chosen = self._candidates(shrink)[: abs(target_prefill - self.n_prefill)]
        self.release_ahead("not chosen", keep={i.id for i in chosen})
        self.predrained = set()  # the chosen ones are _switch's to drain and release now
        if not chosen:
            return
        self.converting = True
        try:
            results = await asyncio.gather(*(self._switch(i, grow) for i in chosen))
            self.n_prefill = sum(
                1
                for i in cluster.instances.values()
                if i.cluster == "local" and i.role == "prefill"
            )
            state.record(
                "split",
                n_prefill=self.n_prefill,
                n_decode=self.sch.n_local - self.n_prefill,
                converted=[i.id for i, ok in zip(chosen, results, strict=True) if ok],
            )
            if self.ctl is not None:  # then re-optimise t for the new split
                decision = await asyncio.to_thread(
                    self.ctl.replan, self.clock.now(), self.bandwidth()
                )
                self.apply(decision.threshold_tokens, decision.scarce)
                state.record(
                    "threshold",
                    threshold_tokens=state.threshold,
                    planned_tokens=decision.threshold_tokens,
                    scarce=decision.scarce,
                    bandwidth_gbps=self.bandwidth() * 8 / 1e9,
                    why="new PD split",
                )
        finally:
            self.converting = False

    async def _switch(self, inst: InstanceView, role: Role) -> bool:
        """Drain one instance (no new work; wait for the router's outstanding count to reach
        zero), then switch its role. On a drain timeout or a refused switch it goes back into
        rotation in its old role."""
        assert self.long is not None
        state, clock = self.state, self.clock
        state.draining.add(inst.id)
        started = clock.now()
        state.record("drain", instance=inst.id, role=inst.role)
        try:
            deadline = started + self.long.drain_timeout
            while self.cluster.outstanding[inst.id] > 0:  # bounded by drain_timeout
                if clock.now() > deadline:
                    state.record("switch_failed", instance=inst.id, reason="drain timed out")
                    return False
                await clock.sleep(clock.real(DRAIN_POLL_S))
            drained = clock.now()
            if not await self.cluster.switch_role(inst.id, role, self.long.role_switch):
                state.record("switch_failed", instance=inst.id, reason="role switch refused")
                return False
            state.record(
                "switched",
                instance=inst.id,
                role=role,
                drain_s=drained - started,
                switch_s=clock.now() - drained,
            )
            return True
        finally:
            state.draining.discard(inst.id)
