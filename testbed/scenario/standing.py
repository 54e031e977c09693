"""A standing deployment (`testbed up`): the scenario's deployment serving outside clients until
it is told to stop, then the usual results.

It reuses the live run's pieces (scenario.runner): the same services, link, samplers, scheduler
event stream, nemesis player and results writer. What differs from `run`:

- no load of its own: clients (AIPerf, the openai package, curl) talk to the router's OpenAI
  surface, and every request any of them sends is in the records, read from the router's
  `/history` at the end;
- time_scale 1 unless told otherwise, so client-side latencies are real-world latencies;
- tokens stream as the decode step produces them (`ServiceSpec.flush_interval_s` 0), so a
  client's inter-token latency is the engine's, not a flush period's;
- it ends on Ctrl-C, SIGTERM or SIGHUP (or `stop`, for tests): requests in flight get up to
  `drain_s` wall seconds to finish, the results are written, every process is stopped.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import signal
from collections.abc import Callable
from dataclasses import dataclass, field

import aiohttp

from testbed.metrics.files import write_jsonl_atomic
from testbed.metrics.records import RequestRecord
from testbed.nemesis import NemesisPlayer, stop_player
from testbed.scenario.plan import RunOptions, RunPlan, RunResult
from testbed.scenario.results import write_results
from testbed.scenario.runner import STOP_SIGNALS, _Run, _shift
from testbed.services.pd import DECODE_PREFIX, PREFILL_PREFIX
from testbed.services.spec import ServiceSpec

__all__ = ["Endpoints", "at_time_scale", "stand_up"]

DRAIN_S = 30.0
"""Wall seconds requests in flight at the stop get to finish before the processes stop."""


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


def at_time_scale(rp: RunPlan, time_scale: float) -> RunPlan:
    """The plan with the scenario's time_scale replaced (byte_scale kept)."""
    sc = rp.scenario
    scale = sc.scale.model_copy(update={"time_scale": time_scale})
    return dataclasses.replace(rp, scenario=sc.model_copy(update={"scale": scale}))


class _Standing(_Run):
    """A live run whose services stream every token as it is produced."""

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
        )

    async def serve(self, stop: asyncio.Event, faults: bool, drain_s: float) -> None:
        """Sample, follow events and play faults until `stop`; then drain and collect."""
        self.clock = self.service_clock.rebased()  # real-world 0: the deployment is up
        connector = aiohttp.TCPConnector(limit=0)
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=10)
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
            sampler = asyncio.create_task(self._sample(session))
            follower = asyncio.create_task(self._scheduler_events(session))
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
                await self._collect(session)

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

    async def _collect(self, session: aiohttp.ClientSession) -> None:
        """Every record the router kept, on the run's clock, in arrival order."""
        assert self.router is not None
        async with asyncio.timeout(30):
            async with session.get(f"{self.router.url}/history") as resp:
                docs = await resp.json()
        recs = [_shift(RequestRecord.from_json(d), self.load_time) for d in docs]
        for rec in sorted(recs, key=lambda r: r.arrival):
            self.submitted.append(rec.id)
            self._record(rec)


async def stand_up(
    rp: RunPlan,
    opts: RunOptions,
    *,
    faults: bool = True,
    on_ready: Callable[[Endpoints], None] = lambda _e: None,
    stop: asyncio.Event | None = None,
    drain_s: float = DRAIN_S,
) -> RunResult:
    """Serve `rp`'s deployment until a stop signal (or `stop`), then write its results."""
    opts.out_dir.mkdir(parents=True, exist_ok=True)
    run = _Standing(rp, opts)
    run.journal_to(opts.out_dir)
    stop = stop if stop is not None else asyncio.Event()
    loop = asyncio.get_running_loop()

    def _interrupt(sig: int) -> None:
        if run.signal is not None:  # a second signal: stop waiting for anything
            raise KeyboardInterrupt
        run.signal = sig
        stop.set()

    installed = []
    for sig in STOP_SIGNALS:
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop.add_signal_handler(sig, _interrupt, int(sig))
            installed.append(sig)
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
        for sig in installed:
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.remove_signal_handler(sig)
