"""`testbed up --router PRESET[:POLICY]` (or a scenario with `router:`): a standing deployment
with an external router in front, for outside clients (curl, the OpenAI SDK, AIPerf).

It is `testbed up` (scenario.standing) with the external-router run's fleet and router
(scenario.external_run): every prefill and decode instance serves the router's flavour of the
PD handshake, the router starts once the fleet is up, and the banner's OpenAI base URL is the
router's. Our own router still runs, idle.

Records: the router keeps none and no load generator of ours saw the requests, so each record
is joined from the attempts the instances journaled (`GET /facade/attempts`, read every quarter
second) alone (external_run.join_attempts), grouped by the body's `testbed_request_id` when the
client sent one, else by vllm-router's request id, else by the room (external_run.attempt_key).
A request is journaled to requests.jsonl as soon as its completed decode attempt is read; at the
stop, after the drain, every group is joined again from all its attempts (its retries) and one
with no completed decode attempt is a failed request with the attempt's reason. Unlike our
router's keeper, the answer is not held until the record is on disk: a SIGKILL of the runner
loses the records of the last quarter second and of every failed request.

What an outside client's record cannot know: the client's own send and receive times (arrival is
the first attempt's arrival at a worker; first and last token are the decode's, server-side),
and the router's own time before its first call to a worker.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any

import aiohttp

from testbed.errors import UserError
from testbed.metrics.samples import SAMPLE_INTERVAL_S
from testbed.scenario.external_run import ExternalRun, join_attempts
from testbed.scenario.plan import RunOptions, RunPlan, RunResult
from testbed.scenario.standing import Endpoints, _Standing, stand_up

__all__ = ["StandingRouter", "stand_up_router"]


class StandingRouter(_Standing, ExternalRun):
    """A standing deployment with the scenario's external router in front (see the module)."""

    fronted = True

    def __init__(self, rp: RunPlan, opts: RunOptions, *, prometheus: bool = False) -> None:
        if prometheus:
            raise UserError("--prometheus does not run with an external router (--router)")
        super().__init__(rp, opts)
        self.journaled: set[str] = set()
        """Requests whose record is in requests.jsonl already (a completed decode attempt)."""
        self.serving: asyncio.Event | None = None
        """The standing deployment's stop: set when the router exits mid-run."""

    def endpoints(self) -> Endpoints:
        ep = super().endpoints()
        assert self.process is not None
        ep.metrics.pop("router", None)  # ours, idle: not on the clients' path
        ep.openai_base = f"{self.process.url}/v1"
        ep.router = self.process.url
        ep.external = f"{self.cfg.preset}:{self.cfg.policy}, log {self.process.log}"
        return ep

    async def serve(
        self,
        stop: asyncio.Event,
        faults: bool,
        drain_s: float,
        on_notice: Callable[[str], None] = lambda _m: None,
    ) -> None:
        self.serving = stop
        await super().serve(stop, faults, drain_s, on_notice)

    async def _sample(self, session: aiohttp.ClientSession) -> None:
        """The external run's sampling; a router that exits stops the deployment."""
        await super()._sample(session)
        if self.serving is not None:
            self.serving.set()

    async def _drain(self, session: aiohttp.ClientSession, drain_s: float) -> None:
        """Wait (bounded) until no worker has work (their `GET /get_load`, either flavour's
        shape): the router's requests in flight have ended at the workers."""
        for _ in range(max(1, int(drain_s / 0.2))):
            if await self._idle(session):
                return
            await asyncio.sleep(0.2)
        self.notes.append(f"requests still in flight after the {drain_s:g}s drain")

    async def _idle(self, session: aiohttp.ClientSession) -> bool:
        for inst in self.workers:
            with contextlib.suppress(aiohttp.ClientError, TimeoutError, ValueError, KeyError):
                async with asyncio.timeout(2):
                    async with session.get(f"{inst.url}/get_load") as resp:
                        doc = await resp.json()
                load = doc["load"] if isinstance(doc, dict) else sum(d["num_reqs"] for d in doc)
                if int(load) > 0:
                    return False
        return True  # a worker that does not answer holds nothing a client waits for

    def _join(self, key: str, journal: bool) -> None:
        rec = join_attempts(key, self.attempts[key], self.load_time)
        if key not in self.records:
            self.submitted.append(key)
        if journal:
            self._record(rec)
            self.journaled.add(key)
        else:
            self.records[key] = rec  # requests.jsonl is rewritten from these at the end

    def _journal_completed(self) -> None:
        for key, attempts in list(self.attempts.items()):
            if key not in self.journaled and any(
                a.get("side") == "decode" and a.get("outcome") == "completed" for a in attempts
            ):
                self._join(key, journal=True)

    async def _keep_records(self, session: aiohttp.ClientSession) -> None:
        """Journal each request once its completed decode attempt has been read (the sampler
        reads the attempts); no router to acknowledge."""
        while True:  # ends when cancelled (_end_records)
            self._journal_completed()
            await asyncio.sleep(SAMPLE_INTERVAL_S)

    async def _end_records(
        self, session: aiohttp.ClientSession, keeper: asyncio.Task[None]
    ) -> None:
        """Every request from all its attempts (read to the last), in arrival order."""
        keeper.cancel()
        await asyncio.gather(keeper, return_exceptions=True)
        await self._read_attempts(session)
        self._journal_completed()
        for key in list(self.attempts):
            self._join(key, journal=key not in self.journaled)
        self.submitted.sort(key=lambda rid: self.records[rid].arrival)


async def stand_up_router(rp: RunPlan, opts: RunOptions, **kw: Any) -> RunResult:
    """scenario.standing.stand_up with the scenario's external router in front."""
    return await stand_up(rp, opts, run_class=StandingRouter, **kw)
