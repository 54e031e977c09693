"""Run a scenario live: stand up the deployment, shape the link, drive the workload, record the
history and write the results. What is decided before (the `RunPlan`) is testbed.scenario.plan.

Order of a run: plan (threshold, PD split, arrival rate) -> start decode workers -> put the link
in front of their KV ports -> start prefill workers and the router -> replay the requests on the
wall clock (real-world time / time_scale) -> drain -> collect engine statistics -> stop services
-> write requests.jsonl, history.jsonl, summary.json, report.md and timeline.png -> run checkers.
Ctrl-C, SIGTERM and SIGHUP stop submitting, fail what is in flight with a reason, and still
write everything; records are journaled to requests.jsonl / history.jsonl as they end, so even a
SIGKILL of the runner loses at most the line being written (testbed.metrics.files).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp

from testbed.clock import LiveClock, until_due
from testbed.kvcache.manager import cluster_capacities
from testbed.link.deployment import LinkSetup
from testbed.metrics.files import Journal, write_jsonl_atomic
from testbed.metrics.records import HistoryEvent, JournaledHistory, RequestRecord
from testbed.metrics.samples import SAMPLE_INTERVAL_S, engine_event, queue_events
from testbed.nemesis import NemesisPlayer, stop_player
from testbed.scenario.outside import OwnedScheduler, start_owned_scheduler
from testbed.scenario.plan import Progress, RunOptions, RunPlan, RunResult
from testbed.scenario.results import write_results
from testbed.scenario.signals import stop_signals
from testbed.services.spec import InstanceInfo, ServiceSpec
from testbed.substrate import make_substrate
from testbed.substrate.base import ServiceHandle, Substrate
from testbed.workload.generate import RequestSpec

__all__ = ["run_scenario"]
ProgressSink = Callable[[Progress], None] | None  # run_class: scenario.external_run

EVENTS_GRACE_S = 5.0
"""Wall seconds the runner waits, at the end, for the router's last events to reach it."""

# Shift applied to every time field of a record when the run clock is re-based.
_TIME_FIELDS = (
    "arrival",
    "prefill_start",
    "prefill_end",
    "transfer_start",
    "transfer_end",
    "first_token",
    "last_token",
)


def _shift(rec: RequestRecord, to_load: Callable[[float], float]) -> RequestRecord:
    for name in _TIME_FIELDS:
        v = getattr(rec, name)
        if v is not None:
            setattr(rec, name, to_load(v))
    return rec


class _Run:
    """State of one live run; see `run_scenario`."""

    def __init__(self, rp: RunPlan, opts: RunOptions) -> None:
        self.rp = rp
        self.opts = opts
        self.scale = rp.scenario.scale
        self.service_clock = LiveClock.paced(self.scale)
        """The services' clock: real-world 0 when the run started (their `t0`)."""
        self.clock = self.service_clock
        """The run's clock: real-world 0 when the load starts (records, faults, history)."""
        self.substrate: Substrate = make_substrate(opts.substrate, opts.out_dir / "logs")
        self.services: dict[str, ServiceHandle] = {}
        self.router: ServiceHandle | None = None
        self.link: LinkSetup | None = None
        self.scheduler: OwnedScheduler | None = None  # policy.command's (scenario.outside)
        self.records: dict[str, RequestRecord] = {}
        self.record_journal: Journal | None = None
        self.history = JournaledHistory()
        self.submitted: list[str] = []
        self.stop = asyncio.Event()
        self.interrupted = False
        self.signal: int | None = None
        self.notes: list[str] = []
        self.events_seen = 0
        """Highest `seq` of the router's events in the history (scheduler.state)."""

    def journal_to(self, out_dir: Path) -> None:
        """Append records and history events to their files as they happen."""
        self.record_journal = Journal(out_dir / "requests.jsonl")
        self.history.journal = Journal(out_dir / "history.jsonl")

    def close_journals(self) -> None:
        for journal in (self.record_journal, self.history.journal):
            if journal is not None:
                journal.close()

    def _record(self, rec: RequestRecord) -> None:
        """A request ended: keep its record and put it on disk at once."""
        self.records[rec.id] = rec
        if self.record_journal is not None:
            self.record_journal.append(rec.to_json())

    def load_time(self, t: float) -> float:
        """A time on the services' clock (records, router events) on the load's clock."""
        return self.clock.reading(t, self.service_clock)

    def _spec(self, role: str, sid: str, cluster: str, hardware: str) -> ServiceSpec:
        dep = self.rp.deployment
        return ServiceSpec(
            role=role,
            id=sid,
            cluster=cluster,
            hardware=hardware,
            model=dep.model,
            time_scale=self.scale.time_scale,
            byte_scale=self.scale.byte_scale,
            t0=self.service_clock.epoch,
            connections=dep.link.connections,
            tpot_slo_s=self.rp.scenario.slo.tpot,
            engine=dep.engine,
            model_seed=dep.tiny_model.seed,
            model_dtype=dep.tiny_model.dtype,
            prompt_seed=self.rp.scenario.seed,
            profiles=list(self.rp.scenario.profiles),
        )

    async def _start_all(self, specs: list[ServiceSpec]) -> list[ServiceHandle]:
        handles = await asyncio.gather(*(self.substrate.start_service(s) for s in specs))
        for h in handles:
            self.services[h.spec.id] = h
        return list(handles)

    async def start(self) -> None:
        dep = self.rp.deployment
        layout = self.rp.layout  # the instances and loops, as every substrate has them
        switchable = layout.switchable
        n_dec, n_pre = len(layout.local_decode), len(layout.local_prefill)
        n_far = len(layout.prfaas_prefill)
        local = ["pd"] * (n_dec + n_pre) if switchable else ["decode"] * n_dec + ["prefill"] * n_pre
        await self.substrate.warm(local + ["prefill"] * n_far + ["router"],
                                  dep.link if n_far else None, self.rp.scenario.seed)  # fmt: skip
        self.scheduler = await start_owned_scheduler(self.rp, self.opts.out_dir)
        local_specs = [
            self._spec("decode", iid, "local", dep.local.hardware) for iid in layout.local_decode
        ]
        if switchable:  # every local PD instance can take either role (services/pd.py)
            local_specs += [
                self._spec("prefill", iid, "local", dep.local.hardware)
                for iid in layout.local_prefill
            ]
            lt = self.rp.scenario.policy.long_term
            local_specs = [
                s.model_copy(
                    update={"role": "pd", "initial_role": s.role, "role_switch_s": lt.role_switch}
                )
                for s in local_specs
            ]
        decoders = await self._start_all(local_specs)
        kv_addrs: dict[str, tuple[str, int]] = {}
        for d in decoders:
            assert d.kv_addr is not None
            kv_addrs[d.spec.id] = d.kv_addr
        self.link = await self.substrate.start_link(
            dep.link,
            self.scale,
            kv_addrs,
            enabled=dep.prfaas is not None,
            seed=self.rp.scenario.seed,
        )
        prefill_specs = []
        if dep.prfaas is not None:
            prefill_specs += [
                self._spec("prefill", iid, "prfaas", dep.prfaas.hardware)
                for iid in layout.prfaas_prefill
            ]
        if not switchable:
            prefill_specs += [
                self._spec("prefill", iid, "local", dep.local.hardware)
                for iid in layout.local_prefill
            ]
        # Prefill workers send KV only to the deployment's receivers (services/kv_targets.py);
        # PD instances, started above, get the same list from the router when they ask.
        kv_targets = sorted(set(kv_addrs.values()) | set(self.link.routes.values()))
        for spec in prefill_specs:
            spec.kv_targets = kv_targets
            if spec.cluster == "prfaas":  # behind a kernel-shaped link (shaper tc, local)
                spec.kv_netns = self.link.sender_netns
        prefills = await self._start_all(prefill_specs)
        instances = [
            InstanceInfo(
                id=p.spec.id,
                cluster=p.spec.cluster,
                role="prefill",
                url=p.url,
                hardware=p.spec.hardware,
            )
            for p in prefills
        ] + [
            InstanceInfo(
                id=d.spec.id,
                cluster="local",
                role="decode" if d.spec.role == "decode" else d.spec.initial_role,
                url=d.url,
                switchable=d.spec.role == "pd",
                kv_host=kv_addrs[d.spec.id][0],
                kv_port=kv_addrs[d.spec.id][1],
                kv_link_host=self.link.routes[d.spec.id][0],
                kv_link_port=self.link.routes[d.spec.id][1],
                hardware=d.spec.hardware,
            )
            for d in decoders
        ]
        router_spec = self._spec("router", "router", "local", dep.local.hardware)
        router_spec.policy = self.scheduler.router_spec if self.scheduler else self.rp.policy
        router_spec.policy_config = self.rp.scenario.policy
        router_spec.threshold_tokens = self.rp.threshold_tokens
        router_spec.instances = instances
        router_spec.prefix_cache_bytes = cluster_capacities(dep)
        router_spec.scheduler = layout.scheduler
        self.router = (await self._start_all([router_spec]))[0]

    async def shutdown(self) -> None:
        await self.substrate.stop_all()
        if self.scheduler is not None:
            await self.scheduler.stop()

    # ------------------------------------------------------------------ load generation

    async def _one(self, session: aiohttp.ClientSession, req: RequestSpec) -> None:
        assert self.router is not None
        if not await until_due(self.clock, req.arrival, self.stop):
            return  # stopped before this request was due: never submitted
        self.submitted.append(req.id)
        body: dict[str, Any] = {
            "id": req.id,
            "input_tokens": req.input_tokens,
            "output_tokens": req.output_tokens,
        }
        if req.hash_ids:  # prompt blocks, for the router's prefix cache (kvcache.manager)
            body["hash_ids"] = list(req.hash_ids)
        try:
            async with session.post(f"{self.router.url}/generate", json=body) as resp:
                if resp.status != 200:
                    raise RuntimeError(f"router answered HTTP {resp.status}: {await resp.text()}")
                async for line in resp.content:
                    if line.startswith(b'{"record"'):
                        doc = json.loads(line)["record"]
                        self._record(_shift(RequestRecord.from_json(doc), self.load_time))
                        return
            raise RuntimeError("router stream ended without a record")
        except asyncio.CancelledError:
            self._fail(req, self.stop_reason or "not finished before drain timeout")
            raise
        except (aiohttp.ClientError, RuntimeError, TimeoutError, json.JSONDecodeError) as exc:
            self._fail(req, f"client: {type(exc).__name__}: {exc}")

    @property
    def stop_reason(self) -> str | None:
        """Why in-flight requests are failed when the run stops early, if it does."""
        if self.signal is not None:
            return f"interrupted ({signal.Signals(self.signal).name})"
        return "interrupted" if self.interrupted else None

    def _fail(self, req: RequestSpec, reason: str) -> None:
        if req.id not in self.records:
            self._record(
                RequestRecord(
                    id=req.id,
                    input_tokens=req.input_tokens,
                    output_tokens=req.output_tokens,
                    arrival=req.arrival,
                    status="failed",
                    failure_reason=reason,
                )
            )

    async def _sample(self, session: aiohttp.ClientSession) -> None:
        """Queue depths (the router's /stats) and link samples every SAMPLE_INTERVAL_S."""
        assert self.router is not None
        while True:
            t = self.clock.now()
            with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                async with asyncio.timeout(2):
                    async with session.get(f"{self.router.url}/stats") as resp:
                        stats = await resp.json()
                rows = stats["instances"]
                self.history.extend(
                    queue_events(
                        t, ((i["id"], i["cluster"], i["role"], i["outstanding"]) for i in rows)
                    )
                )
            if self.link is not None and (link := await self.link.sample_event(t)) is not None:
                self.history.append(link)  # a sample, or a `link_miss` with its reason
            await asyncio.sleep(SAMPLE_INTERVAL_S)

    def progress(self) -> Progress:
        return Progress.of(self.rp, self.clock.now(), len(self.records), len(self.submitted))

    async def drive(self, on_progress: Callable[[Progress], None]) -> None:
        reqs = self.rp.requests
        self.clock = self.service_clock.rebased()  # real-world 0: the first arrival's origin
        last_arrival = reqs[-1].arrival
        for event in self.rp.layout.start_events():  # the threshold in force and the plan
            self.history.append(event)
        connector = aiohttp.TCPConnector(limit=0)
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=10)
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
            sampler = asyncio.create_task(self._sample(session))
            follower = asyncio.create_task(self._scheduler_events(session))
            nemesis = asyncio.create_task(
                NemesisPlayer(self, self.rp.faults, self.history, self.clock).run()
            )
            tasks = [asyncio.create_task(self._one(session, r)) for r in reqs]
            pending = set(tasks)
            try:
                while pending:
                    if self.stop.is_set():
                        break
                    # drain_timeout_s is wall seconds after the last arrival was due
                    if -self.clock.wall_until(last_arrival) > self.opts.drain_timeout_s:
                        self.notes.append(
                            f"{len(pending)} requests unfinished after the "
                            f"{self.opts.drain_timeout_s:.0f}s drain timeout"
                        )
                        break
                    _, pending = await asyncio.wait(pending, timeout=0.5)
                    on_progress(self.progress())
            finally:
                self.stop.set()
                for task in pending:
                    task.cancel()
                await asyncio.gather(*pending, return_exceptions=True)
                sampler.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await sampler
                await stop_player(nemesis)
                await self._end_events(session, follower)
                await self._engine_stats(session)
            on_progress(self.progress())

    async def _scheduler_events(self, session: aiohttp.ClientSession) -> None:
        """Follow the router's event stream (GET /events) into the history as it happens:
        scheduler decisions (threshold, split_check, drain, switched, split, ...) and policy
        changes, each on the load's clock. A broken stream resumes after the last event seen;
        a policy line that repeats the inputs in force is not recorded again."""
        assert self.router is not None
        last_policy: tuple[object, object] = (self.rp.threshold_tokens, False)
        while True:  # ends when cancelled (_end_events)
            with contextlib.suppress(aiohttp.ClientError, ValueError, KeyError, TypeError):
                url = f"{self.router.url}/events"
                async with session.get(url, params={"after": self.events_seen}) as resp:
                    async for line in resp.content:
                        doc = json.loads(line)
                        seq, kind = int(doc.pop("seq")), str(doc.pop("kind"))
                        t = self.load_time(float(doc.pop("t")))
                        if kind == "policy":
                            policy = (doc.get("threshold_tokens"), doc.get("bandwidth_scarce"))
                            if policy != last_policy:
                                last_policy = policy
                                self.history.append(HistoryEvent(t, kind, doc))
                        elif seq > self.events_seen:
                            self.history.append(HistoryEvent(t, kind, doc))
                        self.events_seen = max(self.events_seen, seq)
            await asyncio.sleep(SAMPLE_INTERVAL_S)

    async def _end_events(
        self, session: aiohttp.ClientSession, follower: asyncio.Task[None]
    ) -> None:
        """Stop following the router's events once every event it made so far is in the
        history (its /stats says how many; bounded), then order the history by time."""
        assert self.router is not None
        with contextlib.suppress(aiohttp.ClientError, TimeoutError, ValueError, KeyError):
            async with asyncio.timeout(EVENTS_GRACE_S):
                async with session.get(f"{self.router.url}/stats") as resp:
                    made = int((stats := await resp.json())["events_seq"])
                if isinstance(doc := stats.get("decisions"), dict):  # its fallback, loop lag
                    self.history.append(HistoryEvent(self.clock.now(), "decisions", doc))
                while self.events_seen < made and not follower.done():
                    await asyncio.sleep(0.05)
        follower.cancel()
        await asyncio.gather(follower, return_exceptions=True)
        self.history.sort(key=lambda e: e.t)

    async def _engine_stats(self, session: aiohttp.ClientSession) -> None:
        t = self.clock.now()
        for svc in self.services.values():
            if svc.spec.role == "router":
                continue
            with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                async with asyncio.timeout(5):
                    async with session.get(f"{svc.url}/stats") as resp:
                        stats = await resp.json()
                self.history.append(engine_event(t, svc.spec.id, stats["engine"]))


async def run_scenario(rp: RunPlan, opts: RunOptions, on_progress: ProgressSink = None,
                       run_class: type[_Run] = _Run) -> RunResult:  # fmt: skip
    """Run one prepared scenario live and write its results to `opts.out_dir`."""
    begun = time.perf_counter()
    opts.out_dir.mkdir(parents=True, exist_ok=True)
    run = run_class(rp, opts)
    run.journal_to(opts.out_dir)
    report = on_progress or (lambda progress: None)

    def _interrupt(sig: int) -> None:
        run.interrupted = True
        run.signal = sig
        name = "Ctrl-C" if sig == signal.SIGINT else signal.Signals(sig).name
        run.notes.append(f"interrupted by {name}; in-flight requests failed")
        run.stop.set()

    signals = contextlib.ExitStack()  # kept until the files are written: a signal then is the 2nd
    signals.enter_context(stop_signals(_interrupt))
    try:
        try:
            dep = rp.deployment
            services = 1 + dep.local.instances + (dep.prfaas.instances if dep.prfaas else 0)
            report(Progress("starting", planned=len(rp.requests), services=services))
            await run.start()
            await run.drive(report)
        finally:
            await run.shutdown()
        report(dataclasses.replace(run.progress(), phase="results"))
        run.close_journals()
        ran_s = time.perf_counter() - begun
        records = [run.records[i] for i in run.submitted if i in run.records]
        write_jsonl_atomic(opts.out_dir / "history.jsonl", (e.to_json() for e in run.history))
        result = write_results(
            rp, opts, run.submitted, records, run.history, run.notes, run.interrupted,
            simulate_s=ran_s, started=begun,
        )  # fmt: skip
        result.signal = run.signal
        return result
    finally:
        run.close_journals()
        signals.close()
