"""A live run with an external router (the scenario's `router:`) in front of the fleet.

The fleet is the scenario's deployment as a live run stands it up (scenario.runner), every
prefill and decode instance also serving the router-facing API (services.facade, in the
preset's flavour: `sglang` or `vllm`); the router starts once the fleet is up
(scenario.external_router) and the load generator speaks OpenAI to it (scenario.openai_load).
Our own router still runs, idle: nothing is routed through it.

Records: the router keeps none, so each request's record is joined, at the end of the run, from
what the client saw (its arrival, first and last token, tokens, the router's error) and the
attempts the instances journaled (`GET /facade/attempts`, read every quarter second while the
run goes, so a killed instance loses only its last moments): the decode attempt that completed
it gives the route, the instances, the KV bytes and their verification, the prefill's times; the
decode attempts of one request id are its retries. A request the client saw complete with no
completed attempt on record keeps `kv_verified` false, and kv_accounted says so.

With no client view (`testbed up --router`: outside clients, scenario.standing_router), a
record is joined from the attempts alone (`join_attempts`), grouped by `attempt_key`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import aiohttp
from pydantic import ValidationError

from testbed.clock import until_due
from testbed.config.router import ExternalRouterConfig
from testbed.errors import UserError
from testbed.link.deployment import add_control_proxies
from testbed.metrics.records import HistoryEvent, RequestRecord
from testbed.metrics.samples import SAMPLE_INTERVAL_S
from testbed.policy import get_policy
from testbed.scenario.external_router import PRESETS, RouterProcess, start_router
from testbed.scenario.openai_load import ClientView, PromptText, request_body, submit
from testbed.scenario.plan import Progress, RunOptions, RunPlan, RunResult
from testbed.scenario.runner import _Run, run_scenario
from testbed.scenario.schema import Scenario
from testbed.services.facade.journal import VERIFIED
from testbed.services.spec import InstanceInfo, ServiceSpec
from testbed.workload.generate import RequestSpec

__all__ = [
    "ExternalRun",
    "attempt_key",
    "join_attempts",
    "join_record",
    "run_external",
    "with_router",
]

_SHIFTED = ("prefill_start", "prefill_end", "transfer_start", "transfer_end")


VLLM_ROUTER_ID = "___prefill_addr_"
"""How vllm-router's own request id starts (its X-Request-Id towards both halves)."""


def attempt_key(attempt: dict[str, Any]) -> str | None:
    """The request an attempt belongs to: the client's `testbed_request_id` when it sent one
    (every half and retry of the request carries it); else vllm-router's own id (its
    X-Request-Id towards both halves, `___prefill_addr_..___decode_addr_.._UUID`: the UUID);
    else the room both halves share (SGLang's gateway gives a retry a new room, so each of its
    attempts is then a request of its own). A client's own X-Request-Id is not a key: SGLang's
    gateway passes it to the decode half only, and a client may send the same one twice."""
    if attempt.get("request"):
        return str(attempt["request"])
    rid = attempt.get("router_id")
    if isinstance(rid, str) and rid.startswith(VLLM_ROUTER_ID):
        return "router-" + rid.rsplit("_", 1)[-1]
    if attempt.get("room") is not None:
        return f"room-{attempt['room']}"
    return None


def _served(
    rec: RequestRecord, attempts: list[dict[str, Any]], to_load: Callable[[float], float]
) -> dict[str, Any] | None:
    """Fill `rec` from the decode attempt that completed it (route, instances, KV bytes and
    verification, the prefill's times; the other decode attempts are retries); that attempt.
    With none completed, the KV of the last attempt that verified its own (a stream its worker
    died in: the client got tokens from verified KV) is still the record's; None then."""
    decodes = [a for a in attempts if a.get("side") == "decode"]
    # an attempt journals its progress (VERIFIED) and then, unless its worker died, its outcome
    tried = {(a.get("instance"), a.get("room"), a.get("arrival")) for a in decodes}
    rec.retries = max(0, len(tried) - 1)
    done = [a for a in decodes if a.get("outcome") == "completed"]
    proven = done or [a for a in decodes if a.get("kv_verified")]
    if not proven:
        return None
    a = proven[-1]
    rec.decode_instance = a.get("instance")
    rec.prefill_instance = a.get("prefill_instance")
    rec.route = a.get("route")
    rec.cross_dc = rec.route is not None and rec.route != a.get("cluster")
    for name in _SHIFTED:
        if a.get(name) is not None:
            setattr(rec, name, to_load(float(a[name])))
    rec.kv_wire_bytes_expected = int(a.get("kv_wire_bytes_expected", 0))
    rec.kv_wire_bytes_sent = int(a.get("kv_wire_bytes_sent", 0))
    rec.kv_wire_bytes_received = int(a.get("kv_wire_bytes_received", 0))
    rec.kv_verified = bool(a.get("kv_verified"))
    return a if done else None


def join_record(
    req: RequestSpec,
    view: ClientView,
    attempts: list[dict[str, Any]],
    to_load: Callable[[float], float],
) -> RequestRecord:
    """One request's record from the client's view and the decode attempts journaled for it
    (their times on the services' clock: `to_load` puts them on the load's)."""
    rec = RequestRecord(
        id=req.id,
        input_tokens=req.input_tokens,
        output_tokens=req.output_tokens,
        arrival=view.sent,
    )
    _served(rec, attempts, to_load)
    rec.tokens_out = view.tokens
    rec.first_token, rec.last_token = view.first_token, view.last_token
    if view.error is None:
        rec.status = "completed"
    else:
        rec.failure_reason = view.error
    return rec


def join_attempts(
    rid: str, attempts: list[dict[str, Any]], to_load: Callable[[float], float]
) -> RequestRecord:
    """One request's record from its attempts alone (no client view: an outside client's
    request, `testbed up --router`). Arrival is the first attempt's arrival at a worker; first
    and last token and the tokens are the completing decode attempt's, server-side; with no
    completed decode attempt the request failed, with the last attempt's reason (a decode
    attempt's before a prefill's)."""
    ordered = sorted(attempts, key=lambda a: float(a.get("arrival") or 0.0))
    arrivals = [float(a["arrival"]) for a in ordered if a.get("arrival") is not None]
    decodes = [a for a in ordered if a.get("side") == "decode"]
    sizes = decodes or ordered
    rec = RequestRecord(
        id=rid,
        input_tokens=int(sizes[-1].get("input_tokens") or 0) if sizes else 0,
        output_tokens=int(decodes[-1].get("output_tokens") or 0) if decodes else 0,
        arrival=to_load(arrivals[0]) if arrivals else 0.0,
    )
    done = _served(rec, ordered, to_load)
    if done is not None:
        rec.status = "completed"
        rec.tokens_out = int(done.get("tokens_out") or 0)
        for name in ("first_token", "last_token"):
            if done.get(name) is not None:
                setattr(rec, name, to_load(float(done[name])))
        return rec
    last = (decodes or ordered)[-1] if ordered else {}
    reason = last.get("reason") or "no completed decode attempt"
    if last.get("outcome") == VERIFIED:
        reason = "its KV verified, then no outcome: the worker stopped while it answered"
    rec.failure_reason = f"{last.get('side', 'an')} attempt {last.get('outcome', '')}: {reason}"
    return rec


class ExternalRun(_Run):
    """scenario.runner's run, with the external router in front (see the module's doc)."""

    def __init__(self, rp: RunPlan, opts: RunOptions) -> None:
        super().__init__(rp, opts)
        cfg = rp.scenario.router
        if cfg is None:
            raise UserError("an external-router run needs the scenario's router: section")
        if rp.deployment.engine != "emulated":
            raise UserError("router: an external router runs the emulated engine only, so far")
        if rp.deployment.link.shaper == "tc":
            raise UserError(
                "router: an external router runs with link.shaper emulator only, so far (its "
                "control-path proxies must listen where the router is)"
            )
        if get_policy(rp.policy).long_term and rp.deployment.prfaas is not None:
            raise UserError(
                f"router: an external router needs the planner's static PD split; policy "
                f"{rp.policy} switches roles at run time"
            )
        self.cfg = cfg
        self.process: RouterProcess | None = None
        self.workers: list[InstanceInfo] = []
        self.views: dict[str, ClientView] = {}
        self.requests: dict[str, RequestSpec] = {}
        self.attempts: dict[str, list[dict[str, Any]]] = defaultdict(list)
        self.read_upto: dict[str, int] = {}
        self.boots: dict[str, Any] = {}
        """Each instance's journal identity when last read (facade.journal: `boot`)."""
        self.prompts = PromptText()
        self.instance_at: dict[str, str] = {}
        """host:port -> instance id, for the instances' own addresses and their control-path
        proxies: maps the addresses the router and the decode halves name back to instances."""

    def _spec(self, role: str, sid: str, cluster: str, hardware: str) -> ServiceSpec:
        """Every prefill and decode instance serves the facade; a prefill learns the decode
        instances' KV addresses, direct and through the link (started before it)."""
        spec = super()._spec(role, sid, cluster, hardware)
        if role in ("prefill", "decode"):
            spec.facade = PRESETS[self.cfg.preset].flavour
        if role == "prefill":
            spec.facade_decodes = self._decode_table()
        return spec

    def _decode_table(self) -> list[InstanceInfo]:
        assert self.link is not None
        table = []
        for h in self.services.values():
            if h.spec.role != "decode" or h.kv_addr is None:
                continue
            link = self.link.routes[h.spec.id]
            table.append(
                InstanceInfo(
                    id=h.spec.id,
                    cluster=h.spec.cluster,
                    role="decode",
                    url=h.url,
                    kv_host=h.kv_addr[0],
                    kv_port=h.kv_addr[1],
                    kv_link_host=link[0],
                    kv_link_port=link[1],
                )
            )
        return table

    async def start(self) -> None:
        """The fleet as a live run stands it up, then the router in front of it."""
        await super().start()
        prefills: list[InstanceInfo] = []
        decodes: list[InstanceInfo] = []
        for h in self.services.values():
            s = h.spec
            if s.role == "prefill":
                prefills.append(InstanceInfo(id=s.id, cluster=s.cluster, role="prefill", url=h.url))
            elif s.role == "decode":
                decodes.append(InstanceInfo(id=s.id, cluster=s.cluster, role="decode", url=h.url))
        self.workers = prefills + decodes
        via = await self._control_path(prefills)
        for inst in self.workers:
            self.instance_at[inst.url.removeprefix("http://")] = inst.id
        for iid, url in via.items():
            self.instance_at[url.removeprefix("http://")] = iid
        if via:  # the router's errors name these addresses: the report maps them back
            self.history.append(HistoryEvent(0.0, "control_path", {"proxies": via}))
        self.process = await start_router(
            self.cfg, prefills, decodes, self.opts.out_dir / "logs", via=via
        )

    async def _control_path(self, prefills: list[InstanceInfo]) -> dict[str, str]:
        """The router's calls to PrfaaS prefill instances cross the link's control path: one
        proxy each on the link emulator, with the link's RTT, jitter, partition and reset but
        not its bandwidth cap (testbed.link.deployment.add_control_proxies). Returns instance
        id -> the proxy's URL; empty without a link."""
        if self.link is None or not self.link.enabled:
            return {}
        far = {}
        for p in prefills:
            if p.cluster == "prfaas":
                host, port = p.url.removeprefix("http://").rsplit(":", 1)
                far[p.id] = (host, int(port))
        routes = await add_control_proxies(self.link, self.rp.deployment.link, far)
        return {iid: f"http://{host}:{port}" for iid, (host, port) in routes.items()}

    async def shutdown(self) -> None:
        if self.process is not None:
            await self.process.stop()
        await super().shutdown()

    async def _one(self, session: aiohttp.ClientSession, req: RequestSpec) -> None:
        assert self.process is not None
        if not await until_due(self.clock, req.arrival, self.stop):
            return  # stopped before this request was due: never submitted
        self.submitted.append(req.id)
        self.requests[req.id] = req
        body = request_body(req, self.prompts.prompt(req), self.rp.deployment.model)
        try:
            self.views[req.id] = await submit(session, self.process.url, req, body, self.clock)
        except asyncio.CancelledError:
            self._fail(req, self.stop_reason or "not finished before drain timeout")
            raise

    async def _read_attempts(self, session: aiohttp.ClientSession) -> None:
        """New attempts from every instance's journal (a dead instance is skipped)."""
        for inst in self.workers:
            with contextlib.suppress(aiohttp.ClientError, TimeoutError, ValueError, KeyError):
                doc = await self._journal(session, inst)
                for a in doc["attempts"]:
                    self.read_upto[inst.id] = max(self.read_upto.get(inst.id, 0), int(a["seq"]))
                    self._place(a)
                    if (key := attempt_key(a)) is not None:
                        self.attempts[key].append(a)
                    if a.get("outcome") != VERIFIED:  # progress, for the join only
                        self.history.append(HistoryEvent(self.clock.now(), "attempt", a))

    async def _journal(self, session: aiohttp.ClientSession, inst: InstanceInfo) -> Any:
        """The instance's journal after what was read of it; from the start when the instance
        restarted since (another `boot`: its new journal counts from 1 again)."""
        url = f"{inst.url}/facade/attempts"
        for _ in range(2):
            after = self.read_upto.get(inst.id, 0)
            async with asyncio.timeout(2), session.get(url, params={"after": after}) as resp:
                doc = await resp.json()
            if doc.get("boot") == self.boots.setdefault(inst.id, doc.get("boot")):
                return doc
            self.boots[inst.id] = doc.get("boot")
            self.read_upto[inst.id] = 0
        return doc

    def _place(self, attempt: dict[str, Any]) -> None:
        """An attempt's arrival on the load's clock (`at`, the nemesis' clock too), and for a
        decode attempt the prefill instance the router paired it with (`prefill_target`, from
        the address it met the prefill at), for testbed.metrics.router_reaction."""
        if attempt.get("arrival") is not None:
            attempt["at"] = self.load_time(float(attempt["arrival"]))
        addr = attempt.get("prefill_addr")
        if isinstance(addr, str) and addr in self.instance_at:
            attempt["prefill_target"] = self.instance_at[addr]

    async def _sample(self, session: aiohttp.ClientSession) -> None:
        """The instances' journals and the link, every SAMPLE_INTERVAL_S; a router that exits
        mid-run stops the run with its reason."""
        while True:
            await self._read_attempts(session)
            if self.link is not None and (ev := await self.link.sample_event(self.clock.now())):
                self.history.append(ev)  # a sample, or a `link_miss` with its reason
            if self.process is not None and (why := self.process.exited()) is not None:
                self.notes.append(f"router: {why}")
                self.stop.set()
                return
            await asyncio.sleep(SAMPLE_INTERVAL_S)

    async def _engine_stats(self, session: aiohttp.ClientSession) -> None:
        """At the end: the last attempts, then every record joined (see the module's doc)."""
        await self._read_attempts(session)
        for rid in self.submitted:
            view = self.views.get(rid)
            if rid in self.records or view is None:
                continue
            self._record(join_record(self.requests[rid], view, self.attempts[rid],
                                     self.load_time))  # fmt: skip
        await super()._engine_stats(session)


async def run_external(
    rp: RunPlan, opts: RunOptions, on_progress: Callable[[Progress], None] | None = None
) -> RunResult:
    """Run a scenario with its `router:` live (scenario.runner.run_scenario's results)."""
    return await run_scenario(rp, opts, on_progress, run_class=ExternalRun)


def with_router(scenario: Scenario, option: str, time_scale_set: bool) -> Scenario:
    """`testbed run --router PRESET[:POLICY]`: the scenario with that router in front, at
    time_scale 1 (router timers are wall-clock) unless `--set scale.time_scale=...` says."""
    preset, _, policy = option.partition(":")
    try:
        cfg = ExternalRouterConfig.model_validate(
            {"preset": preset, **({"policy": policy} if policy else {})}
        )
    except ValidationError as exc:
        err = exc.errors()[0]
        where = "".join(f"{p}: " for p in err["loc"])
        msg = str(err["msg"]).removeprefix("Value error, ")
        raise UserError(f"--router {option}: {where}{msg}") from None
    update: dict[str, Any] = {"router": cfg}
    if not time_scale_set:
        update["scale"] = scenario.scale.model_copy(update={"time_scale": 1.0})
    return scenario.model_copy(update=update)
