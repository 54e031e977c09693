"""The router's scheduler loops: the short-term threshold loop and the long-term role loop.

Both feed pure controllers (`scheduler.shortterm`, `scheduler.longterm`) with what the running
system shows and apply their decisions to the router's state; every decision (and the signals
behind it) is appended to `state.events`, which the router serves at `GET /scheduler` and the
scenario runner copies into the run's history.

The planner's workload input is the *observed* input lengths of the requests that arrived in the
last `long_term.window` (`short_term` uses the same window), once there are `min_samples` of
them; before that, the scenario's configured distribution. That is what lets t and the PD split
follow a shift in traffic rather than the distribution the run was started with.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections import deque
from typing import TYPE_CHECKING, Any

import aiohttp
from pydantic import TypeAdapter

from testbed.config import DeploymentConfig, LengthsConfig, LongTermConfig, ShortTermConfig
from testbed.planner import PlanInputs, StagePlan, plan_deployment
from testbed.profiles import MODELS
from testbed.scheduler.balance import QueueBalance
from testbed.scheduler.bandwidth import LinkEstimator, LinkSample
from testbed.scheduler.longterm import LongTermController, StagePressure
from testbed.scheduler.shortterm import ThresholdController
from testbed.services.pd import DECODE_PREFIX, PREFILL_PREFIX
from testbed.services.spec import InstanceInfo
from testbed.workload.build import length_distribution
from testbed.workload.lengths import EmpiricalLengths, LengthDistribution

if TYPE_CHECKING:
    from testbed.services.router import RouterState

__all__ = ["ControlLoops", "role_view"]

MAX_OBSERVED = 5000
"""Cap on remembered arrivals (a 30 s window at 100+ req/s is far beyond any scenario here)."""


def role_view(info: InstanceInfo, role: str) -> InstanceInfo:
    """The router's view of a switchable PD instance serving `role`: its URL points at the
    role's mount in services/pd.py, so every call the router makes reaches the active role."""
    base = info.url.removesuffix(PREFILL_PREFIX).removesuffix(DECODE_PREFIX)
    prefix = PREFILL_PREFIX if role == "prefill" else DECODE_PREFIX
    return info.model_copy(update={"role": role, "url": base + prefix})


class ControlLoops:
    def __init__(self, state: RouterState) -> None:
        sch = state.spec.scheduler
        assert sch is not None
        self.state = state
        self.sch = sch
        self.dep = DeploymentConfig.model_validate(sch.deployment)
        self.configured = length_distribution(
            TypeAdapter(LengthsConfig).validate_python(sch.lengths)
        )
        self.short = ShortTermConfig.model_validate(sch.short_term)
        self.long = (
            LongTermConfig.model_validate(sch.long_term) if sch.long_term is not None else None
        )
        self.window = self.long.window if self.long is not None else LongTermConfig().window
        self.min_samples = (
            self.long.min_samples if self.long is not None else LongTermConfig().min_samples
        )
        self.observed: deque[tuple[float, int]] = deque(maxlen=MAX_OBSERVED)
        self.n_prefill = sch.n_prefill
        self.estimator = LinkEstimator(self.dep.link.bandwidth)
        self.ctl: ThresholdController | None = None
        self.balance = (
            QueueBalance(self.short.balance_margin, self.short.balance_step, self.short.max_bias)
            if self.short.queue_balance
            else None
        )
        self.converting = False
        self.estimates: deque[tuple[float, float]] = deque(maxlen=MAX_OBSERVED)
        """(real time, bandwidth estimate) of every short-term tick."""
        self.pressure_samples: list[StagePressure] = []
        """Stage pressure sampled every short-term tick, averaged per long-term check: one
        instantaneous queue reading is too noisy to act on."""
        profile = MODELS[state.spec.model].decode[self.dep.local.hardware]
        self.bs_max = profile.bs_max(sch.tpot_slo_s)

    # ------------------------------------------------------------------ inputs

    def observe(self, now: float, input_tokens: int) -> None:
        self.observed.append((now, input_tokens))

    def lengths(self) -> LengthDistribution:
        if len(self.observed) < self.min_samples:
            return self.configured
        cutoff = self.state.clock.now() - self.window
        recent = [n for t, n in self.observed if t >= cutoff]
        if len(recent) < self.min_samples:  # a quiet spell: the latest arrivals still tell
            recent = [n for _, n in list(self.observed)[-self.min_samples :]]
        return EmpiricalLengths.of(recent)

    def inputs(self) -> PlanInputs:
        sch = self.sch
        return PlanInputs(self.lengths(), sch.output_tokens, sch.tpot_slo_s, sch.threshold_step)

    def bandwidth(self) -> float:
        est = self.state.bandwidth_estimate
        return est if est is not None else self.dep.link.bandwidth

    def sustained_bandwidth(self) -> float:
        """The most the link offered over the long-term loop's sustain window: a split is
        re-planned for a narrow link only once it has been narrow that long (a drop the
        short-term loop can ride out never converts an instance)."""
        assert self.long is not None
        since = self.state.clock.now() - self.long.sustain * self.long.interval
        recent = [b for t, b in self.estimates if t >= since]
        if not recent or self.estimates[0][0] > since:  # not watched that long yet: nominal
            return max([self.dep.link.bandwidth, *recent])
        return max(recent)

    def plan(self, bandwidth: float, n_prefill: int | None, inputs: PlanInputs) -> StagePlan:
        return plan_deployment(
            "prfaas-pd", self.dep, inputs, link_bytes_per_s=bandwidth, n_prefill=n_prefill
        )

    def event(self, kind: str, **data: Any) -> None:
        self.state.events.append({"t": self.state.clock.now(), "kind": kind, **data})

    # ------------------------------------------------------------------ short-term loop

    async def run_short_term(self) -> None:
        """Estimate the link from the PrfaaS senders; re-plan t when the estimate moves, and
        every `window` anyway (the observed lengths move too)."""
        state = self.state
        st = self.short

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
        state.threshold, state.scarce = ctl.threshold, ctl.scarce
        state.bandwidth_estimate = self.estimator.estimate
        self.event("threshold", threshold_tokens=ctl.threshold, scarce=ctl.scarce, why="start")
        senders = [i for i in state.instances.values() if i.cluster == "prfaas"]
        last_refresh = state.clock.now()
        recorded = state.threshold
        while True:
            await state.clock.sleep(self.short.interval)
            stats = await asyncio.gather(*(state.fetch_stats(i) for i in senders))
            live = [x for x in stats if x is not None]
            if not live:
                continue
            sample = LinkSample(
                t=state.clock.now(),
                bytes_acked=state.scale.real_bytes(sum(x["bytes_acked"] for x in live)),
                # bytes waiting for the sender's window are as much a queue as bytes in flight
                inflight_bytes=state.scale.real_bytes(
                    sum(x["in_flight_bytes"] + x["queued_bytes"] for x in live)
                ),
            )
            state.bandwidth_estimate = self.estimator.update(sample)
            self.estimates.append((sample.t, state.bandwidth_estimate))
            self.pressure_samples.append(self.pressure())
            if not any(state.healthy[i.id] for i in senders):
                continue
            if sample.t - last_refresh >= self.window:
                last_refresh = sample.t
                decision = await asyncio.to_thread(ctl.replan, sample.t, state.bandwidth_estimate)
                why = "workload refresh"
            else:
                decision = await asyncio.to_thread(ctl.update, sample.t, state.bandwidth_estimate)
                why = "bandwidth moved"
            w_prfaas, w_local = self.waits()
            if self.balance is not None:
                self.balance.update(w_prfaas, w_local)
            self.apply(decision.threshold_tokens, decision.scarce)
            moved = abs(state.threshold - recorded) > self.short.min_t_change * recorded
            if decision.changed or moved:
                recorded = state.threshold
                why = why if decision.changed else "queue balance"
                self.event(
                    "threshold",
                    threshold_tokens=state.threshold,
                    planned_tokens=decision.threshold_tokens,
                    bias=self.balance.bias if self.balance is not None else 1.0,
                    scarce=decision.scarce,
                    bandwidth_gbps=state.bandwidth_estimate * 8 / 1e9,
                    inflight_bytes=sample.inflight_bytes,
                    wait_prfaas_s=w_prfaas,
                    wait_local_s=w_local,
                    why=why,
                )

    def apply(self, planned: float, scarce: bool) -> None:
        """Put the planner's t, corrected by the queue balance, in force."""
        bias = self.balance.bias if self.balance is not None else 1.0
        self.state.threshold, self.state.scarce = planned * bias, scarce

    def waits(self) -> tuple[float, float]:
        """Expected prefill wait (real seconds) of a new request on each route: the least
        loaded prefill instance's outstanding requests x the profile's prefill time of their
        mean length. PrfaaS requests stay outstanding until their KV is acknowledged, so a
        queue on the link shows here too."""
        state, dep = self.state, self.dep

        def wait(cluster: str, hardware: str) -> float:
            out = []
            for i in state.instances.values():
                if (
                    i.cluster != cluster
                    or i.role != "prefill"
                    or not state.healthy[i.id]
                    or i.id in state.draining
                ):
                    continue
                n = state.outstanding[i.id]
                mean = state.work[i.id] / n if n else 0.0
                out.append(n * state.model.prefill_time(hardware, mean) if n else 0.0)
            return min(out) if out else math.inf

        hw_prfaas = dep.prfaas.hardware if dep.prfaas is not None else dep.local.hardware
        return wait("prfaas", hw_prfaas), wait("local", dep.local.hardware)

    # ------------------------------------------------------------------ long-term loop

    def pressure(self) -> StagePressure:
        state = self.state
        live = [
            i
            for i in state.instances.values()
            if state.healthy[i.id] and i.id not in state.draining
        ]
        pre = [state.outstanding[i.id] for i in live if i.role == "prefill"]
        dec = [state.outstanding[i.id] for i in live if i.role == "decode"]
        return StagePressure(
            prefill=sum(pre) / len(pre) if pre else float("inf"),
            decode=sum(dec) / (len(dec) * self.bs_max) if dec else float("inf"),
        )

    async def run_long_term(self) -> None:
        """Every `interval`, ask the long-term controller whether the PD split should change;
        convert instances when it says so (drain, switch role, re-plan t)."""
        assert self.long is not None
        lt, state = self.long, self.state
        controller: LongTermController | None = None
        last_reason = ""
        while True:
            await state.clock.sleep(lt.interval)
            if self.converting:
                continue
            inputs, bandwidth = self.inputs(), self.sustained_bandwidth()

            def plan_split(n: int | None, inputs: PlanInputs = inputs, bw: float = bandwidth):
                return self.plan(bw, n, inputs)

            if controller is None:
                controller = LongTermController(
                    plan_split,
                    self.sch.n_local,
                    min_gain=lt.min_gain,
                    sustain=lt.sustain,
                    pressure=lt.pressure,
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
                self.event(
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

    async def convert(self, target_prefill: int) -> None:
        """Move local PD instances between roles until `target_prefill` serve prefill."""
        state = self.state
        grow = "prefill" if target_prefill > self.n_prefill else "decode"
        shrink = "decode" if grow == "prefill" else "prefill"
        candidates = sorted(
            (
                i
                for i in state.instances.values()
                if i.switchable and i.role == shrink and state.healthy[i.id]
            ),
            key=lambda i: (state.work[i.id], state.outstanding[i.id], i.id),
        )
        chosen = candidates[: abs(target_prefill - self.n_prefill)]
        if not chosen:
            return
        self.converting = True
        try:
            results = await asyncio.gather(*(self._switch(i, grow) for i in chosen))
            self.n_prefill = sum(
                1 for i in state.instances.values() if i.cluster == "local" and i.role == "prefill"
            )
            self.event(
                "split",
                n_prefill=self.n_prefill,
                n_decode=self.sch.n_local - self.n_prefill,
                converted=[i.id for i, ok in zip(chosen, results, strict=True) if ok],
            )
            if self.ctl is not None:  # then re-optimise t for the new split
                decision = await asyncio.to_thread(
                    self.ctl.replan, state.clock.now(), self.bandwidth()
                )
                self.apply(decision.threshold_tokens, decision.scarce)
                self.event(
                    "threshold",
                    threshold_tokens=state.threshold,
                    planned_tokens=decision.threshold_tokens,
                    scarce=decision.scarce,
                    bandwidth_gbps=self.bandwidth() * 8 / 1e9,
                    why="new PD split",
                )
        finally:
            self.converting = False

    async def _switch(self, inst: InstanceInfo, role: str) -> bool:
        """Drain one instance (no new work; wait for the router's outstanding count to reach
        zero), then switch its role. On a drain timeout or a refused switch it goes back into
        rotation in its old role."""
        assert self.long is not None
        state = self.state
        state.draining.add(inst.id)
        started = state.clock.now()
        self.event("drain", instance=inst.id, role=inst.role)
        try:
            deadline = started + self.long.drain_timeout
            while state.outstanding[inst.id] > 0:  # bounded by drain_timeout
                if state.clock.now() > deadline:
                    self.event("switch_failed", instance=inst.id, reason="drain timed out")
                    return False
                await asyncio.sleep(0.05)
            drained = state.clock.now()
            base = inst.url.removesuffix(PREFILL_PREFIX).removesuffix(DECODE_PREFIX)
            doc = await self._post_role(base, role)
            if doc is None:
                self.event("switch_failed", instance=inst.id, reason="role switch refused")
                return False
            state.instances[inst.id] = role_view(inst, role)
            self.event(
                "switched",
                instance=inst.id,
                role=role,
                drain_s=drained - started,
                switch_s=state.clock.now() - drained,
            )
            return True
        finally:
            state.draining.discard(inst.id)

    async def _post_role(self, base: str, role: str) -> dict[str, Any] | None:
        """POST /role, retrying while the instance still reports work (a request that raced
        the drain); None if it never accepts."""
        session = self.state.session
        assert session is not None and self.long is not None
        switch_wall = self.state.clock.wall(self.long.role_switch)
        for _ in range(50):  # 50 x 0.1 s wall at most, besides the switch itself
            with contextlib.suppress(aiohttp.ClientError, TimeoutError, ValueError):
                async with asyncio.timeout(switch_wall + 10):
                    async with session.post(f"{base}/role", json={"role": role}) as resp:
                        if resp.status == 200:
                            doc: dict[str, Any] = await resp.json()
                            return doc
                        if resp.status != 409:
                            return None
            await asyncio.sleep(0.1)
        return None
