"""The prefill worker (PrfaaS or PD-P): a FIFO of prefills on one instance, each streaming its KV
layer by layer to the decode instance the router chose.

The engine never waits for the network: completed layers go into the request's transfer, which
runs on its own task, and the engine moves on to the next prefill (the transfer cache of the
paper). `POST /prefill` answers when the request's KV has been sent and acknowledged, with the
lifecycle times in real-world seconds.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from testbed.engine.emulated import PrefillEngine, wire_layer_bytes
from testbed.profiles import MODELS
from testbed.services import cache_pull
from testbed.services.kv_targets import targets_handler
from testbed.services.prefill_queue import PrefillQueue
from testbed.services.spec import ServiceSpec
from testbed.services.validate import health, int_field, json_body, json_errors, str_field
from testbed.transfer.errors import TransferError
from testbed.transfer.payload import PayloadSource

__all__ = ["create_app"]


@dataclass
class PrefillJob:
    id: str
    uncached_tokens: int
    target: tuple[str, int]
    result: asyncio.Future[dict[str, Any]]
    queued_at: float
    times: dict[str, float] = field(default_factory=dict)
    kv_tokens: int | None = None
    """Tokens whose KV goes to decode, when not the computed ones (prefix cache: the decode
    side already holds part of the prompt, or needs a cached part this prefill skipped)."""


class PrefillState(PrefillQueue[PrefillJob]):
    def __init__(self, spec: ServiceSpec) -> None:
        super().__init__(spec)
        self.engine = PrefillEngine(MODELS[spec.model], spec.hardware, self.clock, spec.byte_scale)
        self.payload = PayloadSource(seed=hash(spec.id) & 0xFFFF)

    def job_tokens(self, job: PrefillJob) -> int:
        return job.uncached_tokens

    async def prefill(self, job: PrefillJob) -> None:
        kv_tokens = job.uncached_tokens if job.kv_tokens is None else job.kv_tokens
        sizes = wire_layer_bytes(self.engine.model, kv_tokens, self.spec.byte_scale)
        layers: asyncio.Queue[tuple[int, int] | None] = asyncio.Queue()
        job.times["prefill_start"] = self.clock.now()
        self.track(job, self._transfer(job, sizes, layers))

        async def on_layer(layer: int, nbytes: int) -> None:
            layers.put_nowait((layer, sizes[layer]))  # the layer's KV as decode needs it

        try:
            await self.engine.run(job.uncached_tokens, on_layer)
            job.times["prefill_end"] = self.clock.now()
        finally:
            layers.put_nowait(None)  # after prefill_end: the transfer checks it at the sentinel

    async def _transfer(
        self, job: PrefillJob, sizes: list[int], layers: asyncio.Queue[tuple[int, int] | None]
    ) -> None:
        sent = 0
        try:
            sender = await self.sender(job.target)
            async with sender.open(job.id, sizes) as tx:
                while (item := await layers.get()) is not None:
                    layer, nbytes = item
                    if "transfer_start" not in job.times:
                        job.times["transfer_start"] = self.clock.now()
                    await tx.send_layer(layer, self.payload.layer(job.id, layer, nbytes))
                    sent += nbytes
                if "prefill_end" not in job.times:  # the prefill broke: abort, never half a KV
                    raise RuntimeError("prefill did not finish")
            job.times["transfer_end"] = self.clock.now()
            self._complete(job, kv_wire_bytes_sent=sent)
        except (TransferError, OSError, TimeoutError) as exc:  # anything else: see track()
            reason = exc.reason if isinstance(exc, TransferError) else repr(exc)
            self._fail(job, f"kv transfer: {reason}", kv_wire_bytes_sent=sent)


STATE = web.AppKey("state", PrefillState)


def _bad(message: str) -> web.HTTPBadRequest:
    return web.HTTPBadRequest(text=json.dumps({"error": message}), content_type="application/json")


async def _prefill(request: web.Request) -> web.Response:
    state = request.app[STATE]
    body = await json_body(request)
    rid = str_field(body, "id", 64)
    tokens = int_field(body, "uncached_tokens", 1, 10_000_000)
    target = (str_field(body, "kv_host", 255), int_field(body, "kv_port", 1, 65535))
    state.targets.check(target)
    if state.spec.unsafe_fail_prefill:  # TEST-ONLY: see ServiceSpec.unsafe_fail_prefill
        return web.json_response({"error": "prefill failed (unsafe_fail_prefill)"}, status=502)
    job = PrefillJob(rid, tokens, target, asyncio.get_running_loop().create_future(), 0.0)
    if "kv_tokens" in body:
        job.kv_tokens = int_field(body, "kv_tokens", 1, 10_000_000)
    job.queued_at = state.clock.now()
    result = await state.run_job(job)
    return web.json_response(result, status=200 if "error" not in result else 502)


async def _stats(request: web.Request) -> web.Response:
    state = request.app[STATE]
    return web.json_response({**state.queue_stats(), "engine": state.engine.timing.stats()})


async def create_app(spec: ServiceSpec) -> tuple[web.Application, dict[str, int]]:
    state = PrefillState(spec)
    app = web.Application(client_max_size=1 << 20, middlewares=[json_errors])
    app[STATE] = state
    app.router.add_post("/prefill", _prefill)
    app.router.add_post("/prefix/send", cache_pull.send_handler(STATE))
    app.router.add_post("/targets", targets_handler(STATE))
    app.router.add_get("/stats", _stats)
    app.router.add_get("/health", health)
    worker = asyncio.get_running_loop().create_task(state.worker())

    async def _shutdown(_app: web.Application) -> None:
        await state.aclose(worker)

    app.on_cleanup.append(_shutdown)
    return app, {}
