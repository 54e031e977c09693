"""A standing deployment (`testbed up`): the scenario's deployment serving outside clients until
it is told to stop, then the usual results.

It reuses the live run's pieces (scenario.runner): the same services, link, samplers, scheduler
event stream, nemesis player and results writer. What differs from `run`:

- no load of its own: clients (AIPerf, the openai package, curl) talk to the router's OpenAI
  surface, and every request any of them sends is in the records: the runner follows the
  router's `GET /records` as a keeper (services.router.recorded), journals each record to
  requests.jsonl as `run` does (`_Run.journal_to`) and acknowledges it, and the router holds a
  request's last bytes until then; so once a client has seen its request end, its record is on
  disk, and a SIGKILL of `testbed up` loses none of them;
- time_scale 1 unless told otherwise, so client-side latencies are real-world latencies;
- tokens stream as the decode step produces them (`ServiceSpec.flush_interval_s` 0), so a
  client's inter-token latency is the engine's, not a flush period's;
- it ends on Ctrl-C, SIGTERM or SIGHUP (or `stop`, for tests): requests in flight get up to
  `drain_s` wall seconds to finish, the results are written, every process is stopped
  (scenario.signals, shared with `run`);
- on the compose substrate it can add a Prometheus server scraping every service
  (substrate.compose.prometheus).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import signal
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from testbed.errors import UserError
from testbed.metrics.files import write_jsonl_atomic
from testbed.metrics.records import RequestRecord
from testbed.nemesis import NemesisPlayer, stop_player
from testbed.scenario.plan import RunOptions, RunPlan, RunResult
from testbed.scenario.results import write_results
from testbed.scenario.runner import SAMPLE_INTERVAL_S, _Run, _shift
from testbed.scenario.signals import stop_signals
from testbed.services.pd import DECODE_PREFIX, PREFILL_PREFIX
from testbed.services.spec import ServiceSpec

__all__ = ["Endpoints", "at_time_scale", "stand_up"]

DRAIN_S = 30.0
"""Wall seconds requests in flight at the stop get to finish before the processes stop."""
RECORDS_GRACE_S = 10.0
"""Wall seconds the runner waits, at the end, for the router's last records to reach it."""


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


def at_time_scale(rp: RunPlan, time_scale: float) -> RunPlan:
    """The plan with the scenario's time_scale replaced (byte_scale kept)."""
    sc = rp.scenario
    scale = sc.scale.model_copy(update={"time_scale": time_scale})
    return dataclasses.replace(rp, scenario=sc.model_copy(update={"scale": scale}))


class _Standing(_Run):
    """A live run whose services stream every token as it is produced, and whose records come
    from the router as they end (whoever the client was)."""

    def __init__(self, rp: RunPlan, opts: RunOptions, *, prometheus: bool = False) -> None:
        super().__init__(rp, opts)
        self.records_seen = 0
        """Highest `seq` of the router's records journaled (services.router.recorded)."""
        if prometheus:
            enable = getattr(self.substrate, "enable_prometheus", None)
            if enable is None:
                raise UserError("a Prometheus server needs the compose substrate")
            enable()

    def _spec(self, role: str, sid: str, cluster: str, hardware: str) -> ServiceSpec:
        spec = super()._spec(role, sid, cluster, hardware)
        spec.flush_interval_s = 0.0
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

    async def serve(self, stop: asyncio.Event, faults: bool, drain_s: float) -> None:
        """Sample, follow events and play faults until `stop`; then drain and collect."""
        self.clock = self.service_clock.rebased()  # real-world 0: the deployment is up
        connector = aiohttp.TCPConnector(limit=0)
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=10)
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
            sampler = asyncio.create_task(self._sample(session))
            follower = asyncio.create_task(self._scheduler_events(session))
            keeper = asyncio.create_task(self._keep_records(session))
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
                sampler.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await sampler
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
        while True:  # ends when cancelled (_end_records)
            with contextlib.suppress(aiohttp.ClientError, ValueError, KeyError, TypeError):
                params = {"after": self.records_seen, "keep": 1}
                async with session.get(url, params=params) as resp:
                    async for line in resp.content:
                        doc = json.loads(line)
                        seq = int(doc["seq"])
                        if seq > self.records_seen:
                            self._keep(doc["record"])  # flushed to requests.jsonl here
                            self.records_seen = seq
                        async with session.post(f"{url}/kept", json={"seq": seq}) as ack:
                            await ack.read()
            await asyncio.sleep(SAMPLE_INTERVAL_S)

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
            with contextlib.suppress(aiohttp.ClientError, TimeoutError, ValueError, KeyError):
                async with asyncio.timeout(30):
                    async with session.get(f"{self.router.url}/history") as resp:
                        docs = await resp.json()
                for doc in docs[self.records_seen :]:
                    self._keep(doc)
        self.submitted.sort(key=lambda rid: self.records[rid].arrival)


async def stand_up(
    rp: RunPlan,
    opts: RunOptions,
    *,
    faults: bool = True,
    on_ready: Callable[[Endpoints], None] = lambda _e: None,
    stop: asyncio.Event | None = None,
    drain_s: float = DRAIN_S,
    prometheus: bool = False,
) -> RunResult:
    """Serve `rp`'s deployment until a stop signal (or `stop`), then write its results;
    `prometheus` adds a Prometheus server (compose substrate only)."""
    opts.out_dir.mkdir(parents=True, exist_ok=True)
    run = _Standing(rp, opts, prometheus=prometheus)
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
                await run.serve(stop, faults, drain_s)
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
