"""The sim's side of the dispatch contract (tests/dispatch/harness.py): `SimDispatcher` on a
`SimCluster` built as sim/run.py builds one, in virtual time, the faults played through the
sim's own surfaces (the nemesis's `SimProcesses` and `SimLinkControl`, `SimCluster.mark_down`).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from testbed.clock import LiveClock, Scale
from testbed.dispatch.rules import HEALTH_INTERVAL_S
from testbed.kvcache.manager import KVCacheManager
from testbed.metrics.records import RequestRecord
from testbed.policy.decider import Decider
from testbed.profiles import MODELS
from testbed.scheduler.state import SchedulerState
from testbed.sim.cluster import SimCluster, SimInstance
from testbed.sim.dispatch import SimDispatcher
from testbed.sim.instances import SimDecode, SimPrefill
from testbed.sim.link import SimLink
from testbed.sim.loop import VirtualClock, run_virtual
from testbed.sim.nemesis import SimLinkControl, SimProcesses
from testbed.workload.generate import RequestSpec
from tests.dispatch.harness import (
    CACHE_BYTES,
    DECODES,
    HARDWARE,
    LINK_BYTES_PER_S,
    LINK_RTT_S,
    MODEL,
    PL0,
    PREFILLS,
    PX,
    REQUEST_BOUND_S,
    THRESHOLD,
    TPOT_SLO_S,
    Case,
    Fault,
    Killed,
    KilledInPrefill,
    KilledMidStream,
    LinkCut,
    OutOfRotation,
    Paused,
    Req,
    Restarted,
    faults_of,
)


@dataclass
class SimBuild:
    loop: asyncio.AbstractEventLoop
    cluster: SimCluster
    dispatcher: SimDispatcher
    processes: SimProcesses
    link: SimLinkControl
    records: dict[str, asyncio.Future[RequestRecord]]


def _build_sim(policy: str) -> SimBuild:
    """The case's deployment as sim/run.py builds one: same ids, hardware, link, cache."""
    loop = asyncio.get_running_loop()
    clock = VirtualClock(loop)
    scale = Scale()
    live = LiveClock.paced(scale, epoch=0.0)  # the live router's wall constants, converted
    model = MODELS[MODEL]
    dec = model.decode[HARDWARE["local"]]
    pre = [SimPrefill(loop, i, c, HARDWARE[c], model) for i, c in PREFILLS]
    instances = [
        SimInstance(p.id, p.cluster, "prefill", False, p, None)  # type: ignore[arg-type]
        for p in pre
    ] + [
        SimInstance(
            d,
            "local",
            "decode",
            False,
            None,
            SimDecode(loop, d, dec.step_time, dec.bs_max(TPOT_SLO_S)),
        )
        for d in DECODES
    ]
    link = SimLink(loop, LINK_BYTES_PER_S, LINK_RTT_S, 0.0, seed=0)
    state = SchedulerState(clock, THRESHOLD)
    cluster = SimCluster(
        loop, clock, instances, link, state, scale, live.real(HEALTH_INTERVAL_S), model,
        HARDWARE, None,
    )  # fmt: skip
    records: dict[str, asyncio.Future[RequestRecord]] = {}

    def on_record(rec: RequestRecord) -> None:
        records.setdefault(rec.id, loop.create_future()).set_result(rec)

    cache = KVCacheManager.for_model(model, CACHE_BYTES)
    dispatcher = SimDispatcher(
        cluster, Decider.for_spec(policy), cache, None, scale.byte_scale, live, on_record
    )
    processes = SimProcesses(cluster.instances, dispatcher.lost_instance)
    control = SimLinkControl(link, [f"xdc-{d}" for d in DECODES])
    return SimBuild(loop, cluster, dispatcher, processes, control, records)


async def _sim(case: Case) -> list[RequestRecord]:
    sim = _build_sim(case.policy)
    out: list[RequestRecord] = []
    for req in case.requests:
        faults = faults_of(case, req.id)
        for f in faults:
            await _sim_before(f, sim)
        done = sim.records.setdefault(req.id, sim.loop.create_future())
        now = sim.loop.time()
        spec = RequestSpec(req.id, now, req.input_tokens, req.output_tokens, req.hash_ids)
        sim.dispatcher.submit(spec)
        timed = [sim.loop.create_task(_sim_during(f, req, sim, now)) for f in faults]
        async with asyncio.timeout(REQUEST_BOUND_S):
            out.append(await done)
            for t in timed:
                await t  # a fault that found nothing to hit says so
    return out


async def _sim_before(f: Fault, sim: SimBuild) -> None:
    if isinstance(f, Killed | Restarted):
        await sim.processes.kill(f.instance)
    elif isinstance(f, OutOfRotation):
        await sim.processes.kill(f.instance)
        sim.cluster.mark_down(f.instance)
    elif isinstance(f, Paused):
        await sim.processes.pause(f.instance)
    elif isinstance(f, LinkCut) and not f.midway:
        await sim.link.partition()
    # PrefillError: the sim has no event for it (a prefill in its decode's datacenter always
    # delivers its KV), so nothing is played: the contract test marks the case.


async def _sim_during(f: Fault, req: Req, sim: SimBuild, t0: float) -> None:
    """Faults that hit the request's first attempt while it runs, timed from the model's own
    durations (the request runs alone on idle instances); each checks it hit what it meant to."""
    inst = sim.cluster.instances
    if isinstance(f, Restarted):
        await asyncio.sleep(0.1)  # it failed the first attempt at dispatch
        await sim.processes.restart(f.instance)
    elif isinstance(f, KilledInPrefill):
        pre = inst[f.instance].prefill
        assert pre is not None
        await asyncio.sleep(pre.duration(req.input_tokens) / 2)
        assert pre.running is not None, f"{f}: {f.instance} is not prefilling"
        await sim.processes.kill(f.instance)
    elif isinstance(f, KilledMidStream):
        pre, dec = inst[PL0].prefill, inst[f.instance].decode
        assert pre is not None and dec is not None
        step = dec.step_time(1)
        await asyncio.sleep(pre.duration(req.input_tokens) + (f.tokens + 0.5) * step)
        dec.sync(sim.loop.time())  # the tokens out by now (as kill counts them)
        made = [s.generated for s in dec.active]
        assert made == [f.tokens], f"{f}: {f.instance} had streamed {made}"
        await sim.processes.kill(f.instance)
    elif isinstance(f, LinkCut) and f.midway:
        pre = inst[PX].prefill
        assert pre is not None
        await asyncio.sleep(pre.duration(req.input_tokens) / 2)
        assert sim.link.link.flows, f"{f}: no KV is crossing the link"
        await sim.link.partition()


def run_sim(case: Case) -> list[RequestRecord]:
    """The sim dispatcher's records for the case, in virtual time."""
    return run_virtual(_sim(case))
