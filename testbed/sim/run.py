"""One simulated run: build the modelled deployment, play the requests and the nemesis timeline
in virtual time with the shared policy and scheduler loops, and hand back what a live run
hands to the results pipeline (submitted ids, records, history, notes).

What is decided before the run (policy, split, threshold, requests, faults) comes from the
scenario's run plan (testbed.scenario.plan), exactly as for a live run; `SimInputs` carries the
parts of it the sim reads, so this package stays below the scenario layer.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

from testbed.clock import LiveClock, Scale
from testbed.config import (
    DeploymentConfig,
    PolicyConfig,
)
from testbed.dispatch.rules import HEALTH_INTERVAL_S
from testbed.engine.timing import exact_timing
from testbed.kvcache.manager import KVCacheManager, cluster_capacities
from testbed.metrics.history import RunHistory
from testbed.metrics.records import HistoryEvent, RequestRecord
from testbed.metrics.samples import (
    SAMPLE_INTERVAL_S,
    LinkRate,
    engine_event,
    link_event,
    queue_events,
)
from testbed.metrics.stream import RecordStream
from testbed.metrics.table import RecordTable
from testbed.nemesis import NemesisPlayer, PlannedFault, stop_player
from testbed.policy.decider import Decider, wall_percentiles_ms
from testbed.profiles import MODELS
from testbed.scheduler.cluster import Role
from testbed.scheduler.loops import ControlLoops
from testbed.scheduler.state import SchedulerState
from testbed.sim.cluster import SimCluster, SimInstance, scheduler_history
from testbed.sim.dispatch import SimDispatcher
from testbed.sim.instances import SimDecode, SimPrefill
from testbed.sim.link import SimLink
from testbed.sim.loop import VirtualClock, run_virtual
from testbed.sim.nemesis import SimLinkControl, SimNemesis, SimProcesses
from testbed.substrate.layout import Layout
from testbed.workload.generate import RequestSpec

__all__ = ["SimInputs", "SimOutput", "refuse_unmodelled", "simulate"]


@dataclass
class SimInputs:
    """What the sim reads of a run plan (testbed.scenario.plan.RunPlan)."""

    deployment: DeploymentConfig
    policy: str
    threshold_tokens: float | None
    layout: Layout
    """The instances, the scheduler loops' spec and the starting events, as every substrate
    reads them from the run plan (testbed.substrate.layout)."""
    requests: Sequence[RequestSpec]
    faults: Sequence[PlannedFault]
    seed: int
    scale: Scale
    """The scenario's scales: byte_scale sizes the records' wire bytes as live; time_scale
    converts the live services' wall-clock constants (health polls, timeouts) to real time."""
    tpot_slo_s: float
    drain_timeout_s: float
    """Wall seconds a live run waits after the last arrival (x time_scale here)."""
    policy_config: PolicyConfig | None = None
    """The scenario's `policy` section (a policy's own knobs, testbed.policy.make_policy)."""


@dataclass
class SimOutput:
    submitted: list[str]
    records: list[RequestRecord]
    """Every request's record in submission order; empty when they went to a `RecordStream`."""
    history: list[HistoryEvent]
    """The events in time order; empty when streamed (then `run_history`)."""
    notes: list[str]
    events: int = 0
    """Timer callbacks the virtual loop ran (a measure of the sim's work)."""
    table: RecordTable | None = None
    """With a `RecordStream`: its table, what the summary reads instead of the records."""
    run_history: RunHistory | None = None
    """With a `RecordStream`: the history, its queue samples as columns."""


def _instances(inp: SimInputs, loop: asyncio.AbstractEventLoop) -> list[SimInstance]:
    dep = inp.deployment
    model = MODELS[dep.model]
    dec_profile = model.decode[dep.local.hardware]
    bs_max = dec_profile.bs_max(inp.tpot_slo_s)
    layout = inp.layout

    def prefill(iid: str, cluster: str, hw: str) -> SimPrefill:
        return SimPrefill(loop, iid, cluster, hw, model)

    def decode(iid: str) -> SimDecode:
        return SimDecode(loop, iid, dec_profile.step_time, bs_max)

    out: list[SimInstance] = []
    if dep.prfaas is not None:
        hw = dep.prfaas.hardware
        for iid in layout.prfaas_prefill:
            pre_i = prefill(iid, "prfaas", hw)
            out.append(SimInstance(iid, "prfaas", "prefill", False, pre_i, None))
    hw = dep.local.hardware
    pre, dec = layout.local_prefill, layout.local_decode
    if not layout.switchable:
        out += [
            SimInstance(i, "local", "prefill", False, prefill(i, "local", hw), None) for i in pre
        ]
        out += [SimInstance(i, "local", "decode", False, None, decode(i)) for i in dec]
    else:  # every local PD instance can take either role (services/pd.py)
        roles: list[tuple[str, Role]] = [(i, "decode") for i in dec] + [(i, "prefill") for i in pre]
        for iid, role in roles:
            out.append(
                SimInstance(iid, "local", role, True, prefill(iid, "local", hw), decode(iid))
            )
    return out


async def _run(inp: SimInputs, stream: RecordStream | None) -> SimOutput:
    loop = asyncio.get_running_loop()
    clock = VirtualClock(loop)
    dep = inp.deployment
    # the clock the live services would run on: it converts their wall-time constants
    live = LiveClock.paced(inp.scale, epoch=0.0)
    model = MODELS[dep.model]
    history: list[HistoryEvent] | RunHistory = [] if stream is None else RunHistory()
    notes: list[str] = []
    link = (
        SimLink(loop, dep.link.bandwidth, dep.link.rtt, dep.link.jitter, inp.seed)
        if dep.prfaas is not None
        else None
    )
    instances = _instances(inp, loop)
    state = SchedulerState(clock, inp.threshold_tokens)
    scheduler_history(state, cast(list[HistoryEvent], history))  # appends only
    hardware = {"local": dep.local.hardware}
    if dep.prfaas is not None:
        hardware["prfaas"] = dep.prfaas.hardware
    cluster = SimCluster(
        loop, clock, instances, link, state, inp.scale, live.real(HEALTH_INTERVAL_S), model,
        hardware, dep.link.rtt if dep.prfaas is not None else None,
    )  # fmt: skip
    control: ControlLoops | None = None
    if inp.layout.scheduler is not None:  # the loops the router would run (the run plan's)
        control = ControlLoops(inp.layout.scheduler, cluster, state, clock, inp.scale)
    cache = KVCacheManager.for_model(model, cluster_capacities(dep))
    records: dict[str, RequestRecord] = {}
    done = loop.create_future()
    total = len(inp.requests)

    def on_record(rec: RequestRecord) -> None:
        records[rec.id] = rec
        if len(records) >= total and not done.done():
            done.set_result(None)

    def on_streamed(rec: RequestRecord) -> None:
        assert stream is not None
        stream.put(rec)
        if stream.received >= total and not done.done():
            done.set_result(None)

    decider = Decider.for_spec(inp.policy, inp.policy_config)
    decider.answer_walls = []  # summarised in the `decisions` event (records keep none here)
    dispatcher = SimDispatcher(
        cluster,
        decider,
        cache,
        control,
        inp.scale.byte_scale,
        live,
        on_record if stream is None else on_streamed,
    )
    history.extend(inp.layout.start_events())
    submitted: list[str] = []

    arrivals = sorted(inp.requests, key=lambda r: r.arrival)  # stable: ties keep their order

    def submit(i: int) -> None:
        """Submit the arrivals due now, then set one timer for the next: the loop's timer heap
        holds one arrival, not every request of the run."""
        while i < len(arrivals) and arrivals[i].arrival <= loop.time():
            spec = arrivals[i]
            submitted.append(spec.id)
            if stream is not None:
                stream.submitted(spec.id)
            dispatcher.submit(spec)
            i += 1
        if i < len(arrivals):
            loop.call_at(arrivals[i].arrival, submit, i)

    if arrivals:
        loop.call_at(arrivals[0].arrival, submit, 0)
    proxies = [i.id for i in instances if i.decode is not None]
    ctx = SimNemesis(
        SimProcesses(cluster.instances, dispatcher.lost_instance),
        SimLinkControl(link, [f"xdc-{p}" for p in proxies]) if link is not None else None,
        clock,
    )
    tasks = [
        loop.create_task(_sample(cluster, history, live.real(SAMPLE_INTERVAL_S))),
        # the player appends only
        loop.create_task(
            NemesisPlayer(ctx, inp.faults, cast(list[HistoryEvent], history), clock).run()
        ),
    ]
    if control is not None:
        tasks.append(loop.create_task(control.run_short_term()))
        if control.long is not None:
            tasks.append(loop.create_task(control.run_long_term()))
    last = max((r.arrival for r in inp.requests), default=0.0)
    try:
        await asyncio.wait_for(asyncio.shield(done), last + live.real(inp.drain_timeout_s))
    except TimeoutError:
        left = total - (len(records) if stream is None else stream.received)
        notes.append(
            f"{left} requests unfinished after the {inp.drain_timeout_s:.0f}s drain timeout"
        )
        dispatcher.fail_all("not finished before drain timeout")
    finally:
        await stop_player(tasks[1])
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t
        dispatcher.decider.close()
    # wall latencies only: a decision takes no virtual time
    history.append(HistoryEvent(loop.time(), "decisions", {
        "wall_ms": wall_percentiles_ms(dispatcher.decision_walls),
        "answer_wall_ms": wall_percentiles_ms(decider.answer_walls),
        "fallback": decider.fallback_name,
    }))  # fmt: skip
    _engine_events(instances, history, loop.time())
    if stream is not None:  # in time order as it iterates (RunHistory)
        stream.close()
        assert isinstance(history, RunHistory)
        return SimOutput(submitted, [], [], notes, table=stream.table, run_history=history)
    assert isinstance(history, list)
    history.sort(key=lambda e: e.t)
    ordered = [records[i] for i in submitted if i in records]
    return SimOutput(submitted, ordered, history, notes)


async def _sample(
    cluster: SimCluster, history: list[HistoryEvent] | RunHistory, every: float
) -> None:
    """Queue depths (the router's outstanding counts) and the link's bytes, as live."""
    loop = cluster.loop
    link = cluster.link
    rate = LinkRate()
    instances = list(cluster.instances.values())
    wire = cluster.scale.wire_bytes
    while True:
        t = loop.time()
        depth = cluster.outstanding
        rows = ((i.id, i.cluster, i.role, depth[i.id]) for i in instances)
        if isinstance(history, RunHistory):
            history.add_queue(t, rows)
        else:
            history.extend(queue_events(t, rows))
        if link is not None:
            total = link.carried()
            gbps = rate(t, total) * 8 / 1e9
            history.append(link_event(t, wire(total), gbps, link.capacity * 8 / 1e9))
        await asyncio.sleep(every)


def _engine_events(
    instances: list[SimInstance], history: list[HistoryEvent] | RunHistory, t: float
) -> None:
    """Each instance's engine statistics, as live (modelled time is exact: no lateness)."""
    for inst in instances:
        steps = sum(e.steps for e in inst.engines() if isinstance(e, SimDecode))
        ops = sum(e.operations for e in inst.engines())
        history.append(engine_event(t, inst.id, exact_timing(steps, ops)))


def simulate(inp: SimInputs, stream: RecordStream | None = None) -> SimOutput:
    """Run one scenario's plan in virtual time (testbed.sim.loop). With `stream`, each record
    goes to it as it finishes (requests.jsonl written as the run goes, testbed.metrics.stream)
    and the history keeps its queue samples as columns, so neither is held whole."""
    try:
        return run_virtual(_run(inp, stream))
    except BaseException:
        if stream is not None:
            stream.abort()
        raise


def refuse_unmodelled(name: str, dep: DeploymentConfig) -> None:
    """One line, before anything runs, for what the sim does not model: a real model's engine
    and kernel (tc) shaping of the link."""
    from testbed.errors import UserError

    if dep.engine == "torch":
        raise UserError(
            f"substrate sim: deployment {name!r} runs engine: torch, a real model the sim does "
            "not run; use --substrate local"
        )
    if dep.prfaas is not None and dep.link.shaper == "tc":
        raise UserError(
            f"substrate sim: deployment {name!r} shapes its link with shaper: tc (the kernel), "
            "which the sim does not model; use shaper: emulator or --substrate local"
        )
