"""The live router's side of the dispatch contract (tests/dispatch/harness.py): `RouterState`
over `ScriptedWorkers`, instances that answer as the real workers (services.router.workers)
would when the case's faults hit them.

The live driver runs on the sim's virtual loop (testbed.sim.loop): its asyncio code is unchanged,
and its timeouts (the 10 s register timeout) pass in virtual time, at no wall cost. The one
exception is a case whose request waits for a route: the live no-route deadline reads the
monotonic clock, which virtual time does not move, so such a case runs on a real loop with the
wait shortened (`RouterState.no_route_wait_s`, `health_interval_s`, as
tests/services/test_router_retries.py does).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Iterable
from dataclasses import dataclass, field
from typing import Any

from testbed.metrics.records import RequestRecord
from testbed.services.cache_pull import PullResult
from testbed.services.router.dispatch import RouterState
from testbed.services.router.errors import AttemptError
from testbed.services.spec import InstanceInfo, ServiceSpec
from testbed.sim.loop import run_virtual
from tests.dispatch.harness import (
    CACHE_BYTES,
    DECODES,
    HARDWARE,
    MODEL,
    PARTITIONED,
    PARTITIONED_MIDWAY,
    PREFILLS,
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
    PrefillError,
    Req,
    Restarted,
    faults_of,
)


class ScriptedWorkers:
    """`services.router.workers.Workers` over no processes: instances answer as the real
    workers would when the case's faults hit them."""

    def __init__(self) -> None:
        self.dead: set[str] = set()
        """Connections refused (ClientConnectorError)."""
        self.paused: set[str] = set()
        self.restarting: set[str] = set()
        """Dead for the next call to them, then back."""
        self.die_in_prefill: set[tuple[str, str]] = set()
        self.die_mid_stream: dict[tuple[str, str], int] = {}
        self.prefill_errors: dict[tuple[str, str], str] = {}
        self.cut_midway: set[str] = set()
        """Requests whose KV the partition breaks while it crosses."""
        self.link_cut = False
        self.streamed: dict[str, list[int]] = {}
        """Tokens each request's client got, chunk by chunk."""
        self._request: dict[str, str] = {}
        """Request id of each wire id (the decode's body carries both)."""
        self._kv: dict[str, asyncio.Event] = {}

    def _refused(self, iid: str) -> bool:
        if iid in self.restarting:
            self.restarting.discard(iid)
            return True
        return iid in self.dead

    def _sent(self, wire_id: str) -> asyncio.Event:
        return self._kv.setdefault(wire_id, asyncio.Event())

    async def prefill(
        self, inst: InstanceInfo, body: dict[str, Any], instances: Iterable[InstanceInfo]
    ) -> tuple[int, dict[str, Any]]:
        rid = self._request[body["id"]]
        if self._refused(inst.id):
            raise AttemptError(
                f"prefill on {inst.id} unreachable (ClientConnectorError)", dead=inst.id
            )
        if inst.id in self.paused:
            await asyncio.Event().wait()
        if (inst.id, rid) in self.die_in_prefill:
            self.dead.add(inst.id)
            raise AttemptError(
                f"prefill on {inst.id} unreachable (ServerDisconnectedError)", dead=inst.id
            )
        error = self.prefill_errors.pop((inst.id, rid), None)  # that attempt's, once
        if error is not None:
            return 502, {"error": error, "kv_wire_bytes_sent": 0}
        if inst.cluster == "prfaas":  # its KV crosses the link
            if rid in self.cut_midway:
                self.cut_midway.discard(rid)
                self.link_cut = True
                return 502, {"error": PARTITIONED_MIDWAY, "kv_wire_bytes_sent": 1}
            if self.link_cut:
                return 502, {"error": PARTITIONED, "kv_wire_bytes_sent": 0}
        self._sent(body["id"]).set()
        return 200, {"prefill_start": 0.0, "prefill_end": 0.0, "kv_wire_bytes_sent": 1}

    async def decode(
        self, inst: InstanceInfo, body: dict[str, Any]
    ) -> AsyncGenerator[dict[str, Any], None]:
        rid = body["request"]
        self._request[body["id"]] = rid
        if self._refused(inst.id):
            raise AttemptError(f"decode on {inst.id} lost (ClientConnectorError)", dead=inst.id)
        if inst.id in self.paused:
            await asyncio.Event().wait()  # never registers
        yield {"expecting": True}
        await self._sent(body["id"]).wait()
        yield {"admitted": True, "kv_verified": True}
        n = body["output_tokens"]
        dies_after = self.die_mid_stream.get((inst.id, rid))
        if dies_after is not None:
            yield {"tokens": dies_after}
            self.dead.add(inst.id)
            raise AttemptError(f"decode on {inst.id} lost (ServerDisconnectedError)", dead=inst.id)
        yield {"tokens": n}
        yield {
            "done": True,
            "tokens": n,
            "first_token": 0.0,
            "last_token": 0.0,
            "kv_wire_bytes": 1,
            "kv_verified": True,
        }

    async def first_token(self, inst: InstanceInfo, wire_id: str, token: Any) -> bool:
        return True

    async def cancel_decode(self, inst: InstanceInfo, wire_id: str) -> None:
        return None

    async def pull_prefix(self, **kw: Any) -> PullResult:
        source: InstanceInfo = kw["source"]
        if self._refused(source.id):
            return PullResult(False, 0, 0.0, f"failed: {source.id} unreachable")
        if self.link_cut:
            return PullResult(False, 0, 0.0, f"failed: {PARTITIONED}")
        return PullResult(True, 1, 0.0, "ok")

    async def stats(self, inst: InstanceInfo) -> dict[str, Any] | None:
        return None

    async def healthy(self, inst: InstanceInfo) -> bool:
        return inst.id not in self.dead and inst.id not in self.paused

    async def post_role(self, base_url: str, role: str, wait_s: float) -> dict[str, Any] | None:
        return None


def live_instances() -> list[InstanceInfo]:
    pre = [
        InstanceInfo(id=i, cluster=c, role="prefill", url=f"http://{i}", hardware=HARDWARE[c])  # type: ignore[arg-type]
        for i, c in PREFILLS
    ]
    dec = [
        InstanceInfo(
            id=d,
            cluster="local",
            role="decode",
            url=f"http://{d}",
            hardware=HARDWARE["local"],
            kv_host="127.0.0.1",
            kv_port=7000 + n,
            kv_link_host="127.0.0.2",
            kv_link_port=7100 + n,
        )
        for n, d in enumerate(DECODES)
    ]
    return pre + dec


@dataclass
class LiveRun:
    records: list[RequestRecord]
    streamed: dict[str, list[int]] = field(default_factory=dict)


async def _live(case: Case) -> LiveRun:
    spec = ServiceSpec(
        role="router", id="router", model=MODEL, policy=case.policy, threshold_tokens=THRESHOLD,
        instances=live_instances(), prefix_cache_bytes=CACHE_BYTES, tpot_slo_s=TPOT_SLO_S,
    )  # fmt: skip
    workers = ScriptedWorkers()
    state = RouterState(spec, workers)
    await state.open()
    if case.waits_for_route:  # a real loop: wall seconds, kept short
        back = any(isinstance(f, Restarted) for f in case.faults)
        state.no_route_wait_s = 5.0 if back else 0.2  # an upper bound when one comes back
        state.health_interval_s = 0.05
    watcher = asyncio.create_task(state.watch_health())  # as the router app runs it
    records: list[RequestRecord] = []
    try:
        for req in case.requests:
            for f in faults_of(case, req.id):
                _live_fault(f, req, state, workers)
            chunks = workers.streamed.setdefault(req.id, [])

            async def sink(n: int, chunks: list[int] = chunks) -> None:
                chunks.append(n)

            async with asyncio.timeout(REQUEST_BOUND_S):
                rec = await state.handle(
                    req.id, req.input_tokens, req.output_tokens, sink, hash_ids=req.hash_ids
                )
            records.append(rec)
    finally:
        watcher.cancel()
        await state.aclose()
    return LiveRun(records, workers.streamed)


def _live_fault(f: Fault, req: Req, state: RouterState, w: ScriptedWorkers) -> None:
    if isinstance(f, Killed):
        w.dead.add(f.instance)
    elif isinstance(f, OutOfRotation):
        w.dead.add(f.instance)
        state.mark_down(f.instance)
    elif isinstance(f, Restarted):
        w.restarting.add(f.instance)
    elif isinstance(f, Paused):
        w.paused.add(f.instance)
    elif isinstance(f, KilledInPrefill):
        w.die_in_prefill.add((f.instance, req.id))
    elif isinstance(f, KilledMidStream):
        w.die_mid_stream[f.instance, req.id] = f.tokens
    elif isinstance(f, LinkCut):
        if f.midway:
            w.cut_midway.add(req.id)
        else:
            w.link_cut = True
    elif isinstance(f, PrefillError):
        w.prefill_errors[f.instance, req.id] = f.error


def run_live(case: Case) -> LiveRun:
    """The live router's records for the case (virtual loop unless it waits for a route)."""
    if case.waits_for_route:
        return asyncio.run(_live(case))
    return run_virtual(_live(case))
