"""A standing deployment (`testbed up`): the scenario's deployment serving outside clients until
it is told to stop, then the usual results.

It reuses the live run's pieces (scenario.runner): the same services, link, samplers, scheduler
event stream, nemesis player and results writer. What differs from `run`:

- no load of its own: clients (AIPerf, the openai package, curl) talk to the router's OpenAI
  surface, and every request any of them sends is in the records: the runner follows the
  router's `GET /records` as its keeper (services.router.recorded; authenticated by a random
  token only this runner and the router know), journals each record to requests.jsonl as `run`
  does (`_Run.journal_to`) and acknowledges it, and the router holds a request's last bytes
  until then, however long; so once a client has seen its request end, its record is on disk,
  and a SIGKILL of `testbed up` (stalled or not) loses none of them. A runner that stalls
  stalls the answers: the router logs it, and the runner says so when it resumes;
- it watches its services: one that dies (a worker killed from outside, say) is reported on
  the console at once (`on_notice`) and in the results' notes at exit;
- time_scale 1 unless told otherwise, so client-side latencies are real-world latencies;
- tokens stream as the decode step produces them (`ServiceSpec.flush_interval_s` 0), so a
  client's inter-token latency is the engine's, not a flush period's;
- it ends on Ctrl-C, SIGTERM or SIGHUP (or `stop`, for tests): requests in flight get up to
  `drain_s` wall seconds to finish, the results are written, every process is stopped
  (scenario.signals, shared with `run`);
- on the compose substrate it can add a Prometheus server scraping every service
  (substrate.compose.prometheus);
- with the scenario's `router:` (`testbed up --router`), an external router stands in front
  instead and the records are joined from the workers' attempts (scenario.standing_router).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import secrets
import signal
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from testbed.errors import UserError
from testbed.metrics.files import write_jsonl_atomic
from testbed.metrics.records import RequestRecord
from testbed.metrics.samples import SAMPLE_INTERVAL_S
from testbed.nemesis import NemesisPlayer, stop_player
from testbed.scenario.plan import RunOptions, RunPlan, RunResult
from testbed.scenario.results import write_results
from testbed.scenario.runner import _Run, _shift
from testbed.scenario.signals import stop_signals
from testbed.services.pd import DECODE_PREFIX, PREFILL_PREFIX
from testbed.services.router.recorded import HISTORY_PAGE, KEEPER_HEADER
from testbed.services.spec import ServiceSpec

__all__ = ["Endpoints", "at_time_scale", "stand_up"]

DRAIN_S = 30.0
"""Wall seconds requests in flight at the stop get to finish before the processes stop."""
RECORDS_GRACE_S = 10.0
"""Wall seconds the runner waits, at the end, for the router's last records to reach it."""
WATCH_S = 1.0
"""Wall seconds between looks at the services' processes and the router's keeper state."""


@dataclass
class Endpoints:
    """Where outside clients reach a standing deployment."""

    openai_base: str
    """The OpenAI base URL (`.../v1`)."""
    router: str
    link_api: str | None
    """The link emulator's Toxiproxy-compatible API, when the deployment has a link."""
    metrics: dict[str, str] = field(default_factory=dict)
    """Service id -> its Prometheus /metrics URL."""
    prometheus: str | None = None
    """The Prometheus server scraping them all (compose substrate, `--prometheus`)."""
    external: str | None = None
    """The external router in front (`--router`): its preset, policy and log file."""


def at_time_scale(rp: RunPlan, time_scale: float) -> RunPlan:
    """The plan with the scenario's time_scale replaced (byte_scale kept)."""
    sc = rp.scenario
    scale = sc.scale.model_copy(update={"time_scale": time_scale})
    return dataclasses.replace(rp, scenario=sc.model_copy(update={"scale": scale}))


class _Standing(_Run):
    """A live run whose services stream every token as it is produced, and whose records come
    from the router as they end (whoever the client was)."""

    fronted = False
    """True for a class that puts the scenario's external router in front (standing_router)."""

    def __init__(self, rp: RunPlan, opts: RunOptions, *, prometheus: bool = False) -> None:
        if rp.scenario.router is not None and not self.fronted:
            raise UserError("router: a standing deployment with an external router is "
                            "scenario.standing_router's (testbed up --router)")  # fmt: skip
        super().__init__(rp, opts)
        self.records_seen = 0
        """Highest `seq` of the router's records journaled (services.router.recorded)."""
        self.keeper_token = secrets.token_urlsafe(32)
        """The router holds answers only for a keeper with this (ServiceSpec.keeper_token)."""
        self.deaths: dict[str, tuple[float, str]] = {}
        """Services whose process has ended: id -> (run time, how it ended)."""
        self.revived: list[str] = []
        """Services that died and came back (a nemesis restart), for the notes."""
        self.keeper_stalls = 0
        """Times the router found this runner's keeping stalled (its /stats' keeper.stalls)."""
        if prometheus:
            enable = getattr(self.substrate, "enable_prometheus", None)
            if enable is None:
                raise UserError("a Prometheus server needs the compose substrate")
            enable()

    def _spec(self, role: str, sid: str, cluster: str, hardware: str) -> ServiceSpec:
        spec = super()._spec(role, sid, cluster, hardware)
        spec.flush_interval_s = 0.0
        if role == "router":
            spec.keeper_token = self.keeper_token
        return spec

    def endpoints(self) -> Endpoints:
        assert self.router is not None
        metrics = {"router": f"{self.router.url}/metrics"}
        for sid, svc in sorted(self.services.items()):
            if svc.spec.role in ("prefill", "decode"):
                metrics[sid] = f"{svc.url}/metrics"
            elif svc.spec.role == "pd":  # both roles' apps are mounted (services/pd.py)
                metrics[f"{sid}/prefill"] = f"{svc.url}{PREFILL_PREFIX}/metrics"
                metrics[f"{sid}/decode"] = f"{svc.url}{DECODE_PREFIX}/metrics"
        client = self.link.client if self.link is not None else None
        return Endpoints(
            openai_base=f"{self.router.url}/v1",
            router=self.router.url,
            link_api=client.url if client is not None else None,
            metrics=metrics,
            prometheus=getattr(self.substrate, "prometheus_url", None),
        )

    async def serve(
        self,
        stop: asyncio.Event,
        faults: bool,
        drain_s: float,
        on_notice: Callable[[str], None] = lambda _m: None,
    ) -> None:
        """Sample, follow events, watch the services and play faults until `stop`; then drain
        and collect. `on_notice` gets a line for each service that dies and for a stalled
        keeper."""
        self.clock = self.service_clock.rebased()  # real-world 0: the deployment is up
        for event in self.rp.layout.start_events():  # the threshold and the plan, as `run`'s
            self.history.append(event)
        connector = aiohttp.TCPConnector(limit=0)
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=10)
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
            sampler = asyncio.create_task(self._sample(session))
            follower = asyncio.create_task(self._scheduler_events(session))
            keeper = asyncio.create_task(self._keep_records(session))
            watcher = asyncio.create_task(self._watch(session, on_notice))
            nemesis = asyncio.create_task(
                NemesisPlayer(
                    self, self.rp.faults if faults else [], self.history, self.clock
                ).run()
            )
            try:
                await stop.wait()
            finally:
                await stop_player(nemesis)
                await self._drain(session, drain_s)
                for task in (sampler, watcher):
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await task
                self._death_notes()
                await self._end_events(session, follower)
                await self._engine_stats(session)
                await self._end_records(session, keeper)

    async def _drain(self, session: aiohttp.ClientSession, drain_s: float) -> None:
        """Wait (bounded) for the router to have nothing in flight."""
        assert self.router is not None
        for _ in range(max(1, int(drain_s / 0.2))):
            with contextlib.suppress(aiohttp.ClientError, TimeoutError, ValueError, KeyError):
                async with asyncio.timeout(2):
                    async with session.get(f"{self.router.url}/stats") as resp:
                        if int((await resp.json())["in_flight"]) == 0:
                            return
            await asyncio.sleep(0.2)
        self.notes.append(f"requests still in flight after the {drain_s:g}s drain")

    def _keep(self, doc: dict[str, Any]) -> None:
        """One record from the router: on the run's clock, into the journal."""
        rec = _shift(RequestRecord.from_json(doc), self.load_time)
        if rec.id not in self.records:
            self.submitted.append(rec.id)
        self._record(rec)

    async def _keep_records(self, session: aiohttp.ClientSession) -> None:
        """Follow the router's records as they end (GET /records?keep=1): journal each one,
        then tell the router it is kept (POST /records/kept), which releases the answer to its
        client. A broken stream resumes after the last record kept."""
        assert self.router is not None
        url = f"{self.router.url}/records"
        auth = {KEEPER_HEADER: self.keeper_token}
        while True:  # ends when cancelled (_end_records)
            with contextlib.suppress(aiohttp.ClientError, ValueError, KeyError, TypeError):
                params = {"after": self.records_seen, "keep": 1}
                async with session.get(url, params=params, headers=auth) as resp:
                    resp.raise_for_status()
                    async for line in resp.content:
                        doc = json.loads(line)
                        seq = int(doc["seq"])
                        if seq > self.records_seen:
                            self._keep(doc["record"])  # flushed to requests.jsonl here
                            self.records_seen = seq
                        body = {"seq": seq}
                        async with session.post(f"{url}/kept", json=body, headers=auth) as ack:
                            await ack.read()
            await asyncio.sleep(SAMPLE_INTERVAL_S)

    async def _watch(
        self, session: aiohttp.ClientSession, on_notice: Callable[[str], None]
    ) -> None:
        """Every WATCH_S: a line for each service whose process ended (and came back: a
        nemesis restart), and one when the router says this runner's keeping has stalled."""
        while True:
            for sid, handle in list(self.services.items()):
                how = await self.substrate.exited(handle)
                if how is not None and sid not in self.deaths:
                    self.deaths[sid] = (self.clock.now(), how)
                    on_notice(f"service {sid} died ({how}) at {self.clock.now():.1f}s")
                elif how is None and sid in self.deaths:
                    t, how = self.deaths.pop(sid)
                    now = self.clock.now()
                    self.revived.append(f"{sid} died ({how}) at {t:.1f}s, ran again at {now:.1f}s")
                    on_notice(f"service {sid} is running again at {now:.1f}s")
            await self._watch_keeper(session, on_notice)
            await asyncio.sleep(WATCH_S)

    async def _watch_keeper(
        self, session: aiohttp.ClientSession, on_notice: Callable[[str], None]
    ) -> None:
        assert self.router is not None
        with contextlib.suppress(aiohttp.ClientError, TimeoutError, ValueError, KeyError):
            async with asyncio.timeout(2):
                async with session.get(f"{self.router.url}/stats") as resp:
                    keeper = (await resp.json())["keeper"]
            stalls = int(keeper["stalls"])
            if stalls > self.keeper_stalls:
                self.keeper_stalls = stalls
                on_notice(
                    f"this runner's journal stalled: the router held answers up to "
                    f"{float(keeper['longest_hold_s']):.1f}s until their records were on disk"
                    f" ({int(keeper['answers_held'])} held now)"
                )

    def _death_notes(self) -> None:
        """The services dead at the stop, for the results (report.md) and the exit report."""
        for sid, (t, how) in sorted(self.deaths.items()):
            self.notes.append(f"service {sid} dead at exit: it died ({how}) at {t:.1f}s")
        self.notes.extend(f"service {line}" for line in self.revived)
        if self.keeper_stalls:
            self.notes.append(
                f"the keeper stalled {self.keeper_stalls} time(s): the router held answers "
                "until their records were on disk"
            )

    async def _end_records(
        self, session: aiohttp.ClientSession, keeper: asyncio.Task[None]
    ) -> None:
        """Stop following the records once every record the router made is kept (its /stats
        says how many; bounded by RECORDS_GRACE_S); any still missing then come from
        /history. Then order them by arrival."""
        assert self.router is not None
        made = None
        with contextlib.suppress(aiohttp.ClientError, TimeoutError, ValueError, KeyError):
            async with asyncio.timeout(RECORDS_GRACE_S):
                async with session.get(f"{self.router.url}/stats") as resp:
                    made = int((await resp.json())["recorded"])
                while self.records_seen < made and not keeper.done():
                    await asyncio.sleep(0.05)
        keeper.cancel()
        await asyncio.gather(keeper, return_exceptions=True)
        if made is None or self.records_seen < made:
            await self._history_after(session)
        self.submitted.sort(key=lambda rid: self.records[rid].arrival)

    async def _history_after(self, session: aiohttp.ClientSession) -> None:
        """The records after the last one journaled, from the router's `GET /history`, a page
        at a time (a page shorter than HISTORY_PAGE is the last; bounded in time)."""
        assert self.router is not None
        with contextlib.suppress(aiohttp.ClientError, TimeoutError, ValueError, KeyError):
            async with asyncio.timeout(30):
                while True:
                    params = {"after": self.records_seen, "limit": HISTORY_PAGE}
                    async with session.get(f"{self.router.url}/history", params=params) as resp:
                        resp.raise_for_status()
                        docs = await resp.json()
                    for doc in docs:
                        self._keep(doc)
                        self.records_seen += 1
                    if len(docs) < HISTORY_PAGE:
                        return


async def stand_up(
    rp: RunPlan,
    opts: RunOptions,
    *,
    faults: bool = True,
    on_ready: Callable[[Endpoints], None] = lambda _e: None,
    stop: asyncio.Event | None = None,
    drain_s: float = DRAIN_S,
    prometheus: bool = False,
    on_notice: Callable[[str], None] = lambda _m: None,
    run_class: type[_Standing] | None = None,
) -> RunResult:
    """Serve `rp`'s deployment until a stop signal (or `stop`), then write its results;
    `prometheus` adds a Prometheus server (compose substrate only); `on_notice` gets a line
    for each service that dies and for a stalled keeper, as they happen. `run_class`:
    scenario.standing_router's for a scenario with `router:` (its `stand_up_router`)."""
    opts.out_dir.mkdir(parents=True, exist_ok=True)
    run = (run_class or _Standing)(rp, opts, prometheus=prometheus)
    run.journal_to(opts.out_dir)
    stop = stop if stop is not None else asyncio.Event()

    def _interrupt(sig: int) -> None:
        run.signal = sig
        stop.set()

    with stop_signals(_interrupt):
        try:
            try:
                await run.start()
                on_ready(run.endpoints())
                await run.serve(stop, faults, drain_s, on_notice)
                duration = max(run.clock.now(), 1e-3)
            finally:
                await run.shutdown()
            run.close_journals()
            write_jsonl_atomic(opts.out_dir / "history.jsonl", (e.to_json() for e in run.history))
            if run.signal is not None:
                run.notes.append(f"stopped by {signal.Signals(run.signal).name}")
            done = dataclasses.replace(rp, duration_s=duration, requests=[])
            records = [run.records[i] for i in run.submitted]
            result = write_results(done, opts, run.submitted, records, run.history, run.notes, True)
            # Stopping is how a standing deployment ends: the exit code is the checkers' verdict.
            result.interrupted, result.signal = False, None
            return result
        finally:
            run.close_journals()
