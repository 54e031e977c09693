"""The prefill worker (PrfaaS or PD-P): a FIFO of prefills on one instance, each streaming its KV
layer by layer to the decode instance the router chose.

The engine never waits for the network: completed layers go into the request's transfer, which
runs on its own task, and the engine moves on to the next prefill (the transfer cache of the
paper). `POST /prefill` answers when the request's KV has been sent and acknowledged, with the
lifecycle times in real-world seconds.

The engine is an adapter (services.engines): `emulated` takes `uncached_tokens` (and optionally
`kv_tokens`) and sends deterministic bytes of the profile's KV size; `torch` takes the prompt's
token ids (`tokens`), sends the tiny model's real KV tensors and answers with `first_token_id`.
The queue, the transfers, the validation of the rest of the request and /stats are shared.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from testbed.services import cache_pull
from testbed.services.engines import prefill_adapter
from testbed.services.engines.base import PrefillAdapter
from testbed.services.exposition import add_metrics_route, worker_registry, worker_samples
from testbed.services.kv_targets import targets_handler
from testbed.services.prefill_queue import PrefillQueue
from testbed.services.spec import ServiceSpec
from testbed.services.validate import health, int_field, json_body, json_errors, str_field
from testbed.transfer.errors import TransferError

__all__ = ["STATE", "PrefillJob", "PrefillState", "create_app"]


@dataclass
class PrefillJob:
    id: str
    work: Any
    """What the engine needs of this request (PrefillAdapter.parse)."""
    target: tuple[str, int]
    result: asyncio.Future[dict[str, Any]]
    queued_at: float = 0.0
    times: dict[str, float] = field(default_factory=dict)
    answer: dict[str, Any] = field(default_factory=dict)
    """The engine's fields of the answer (PrefillAdapter.run)."""


class PrefillState(PrefillQueue[PrefillJob]):
    def __init__(self, spec: ServiceSpec, engine: PrefillAdapter[Any] | None = None) -> None:
        super().__init__(spec)
        self.engine = engine if engine is not None else prefill_adapter(spec, self.clock)
        self.prompt_tokens = 0
        """Tokens prefilled by requests that completed (vllm:prompt_tokens_total)."""

    def job_tokens(self, job: PrefillJob) -> int:
        return self.engine.tokens(job.work)

    async def prefill(self, job: PrefillJob) -> None:
        sizes = self.engine.layer_sizes(job.work)
        layers: asyncio.Queue[tuple[int, Any] | None] = asyncio.Queue()
        job.times["prefill_start"] = self.clock.now()
        self.track(job, self._transfer(job, sizes, layers))

        def on_layer(layer: int, item: Any) -> None:
            layers.put_nowait((layer, item))

        try:
            job.answer = await self.engine.run(job.id, job.work, sizes, on_layer)
            job.times["prefill_end"] = self.clock.now()
            if "prefill_start" in job.answer:  # the engine counted from an earlier start
                job.times["prefill_start"] = float(job.answer.pop("prefill_start"))
        finally:
            layers.put_nowait(None)  # after prefill_end: the transfer checks it at the sentinel

    async def _transfer(
        self, job: PrefillJob, sizes: Sequence[int], layers: asyncio.Queue[tuple[int, Any] | None]
    ) -> None:
        sent = 0
        try:
            sender = await self.sender(job.target)
            async with sender.open(job.id, list(sizes)) as tx:
                while (item := await layers.get()) is not None:
                    layer, data = item
                    if "transfer_start" not in job.times:
                        job.times["transfer_start"] = self.clock.now()
                    buf = self.engine.payload(job.id, layer, data)
                    await tx.send_layer(layer, buf)
                    sent += len(buf)
                if "prefill_end" not in job.times:  # the prefill broke: abort, never half a KV
                    raise RuntimeError("prefill did not finish")
            job.times["transfer_end"] = self.clock.now()
            self._complete(job, kv_wire_bytes_sent=sent, **job.answer)
        except (TransferError, OSError, TimeoutError, RuntimeError) as exc:  # others: track()
            reason = exc.reason if isinstance(exc, TransferError) else repr(exc)
            self._fail(job, f"kv transfer: {reason}", kv_wire_bytes_sent=sent)


STATE = web.AppKey("state", PrefillState)


async def _prefill(request: web.Request) -> web.Response:
    state = request.app[STATE]
    body = await json_body(request)
    rid = str_field(body, "id", 64)
    work = state.engine.parse(body)
    target = (str_field(body, "kv_host", 255), int_field(body, "kv_port", 1, 65535))
    state.targets.check(target)
    if state.spec.unsafe_fail_prefill:  # TEST-ONLY: see ServiceSpec.unsafe_fail_prefill
        return web.json_response({"error": "prefill failed (unsafe_fail_prefill)"}, status=502)
    job = PrefillJob(rid, work, target, asyncio.get_running_loop().create_future())
    job.queued_at = state.clock.now()
    result = await state.run_job(job)
    if "error" not in result:
        state.prompt_tokens += state.job_tokens(job)
    return web.json_response(result, status=200 if "error" not in result else 502)


async def _stats(request: web.Request) -> web.Response:
    state = request.app[STATE]
    kind = {"engine_kind": state.engine.kind} if state.engine.kind is not None else {}
    return web.json_response({**state.queue_stats(), **kind, "engine": state.engine.stats()})


async def create_app(
    spec: ServiceSpec, engine: PrefillAdapter[Any] | None = None
) -> tuple[web.Application, dict[str, int]]:
    """The prefill worker's app; the engine is the spec's unless one is given."""
    state = PrefillState(spec, engine)
    app = web.Application(client_max_size=state.engine.max_body, middlewares=[json_errors])
    app[STATE] = state
    app.router.add_post("/prefill", _prefill)
    if state.engine.prefix_payload is not None:
        app.router.add_post(
            "/prefix/send", cache_pull.send_handler(STATE, state.engine.prefix_payload)
        )
    app.router.add_post("/targets", targets_handler(STATE))
    app.router.add_get("/stats", _stats)
    app.router.add_get("/health", health)
    add_metrics_route(
        app,
        worker_registry(
            lambda: worker_samples(
                state.queue_stats(),
                model=spec.model,
                byte_scale=spec.byte_scale,
                tokens=state.prompt_tokens,
            )
        ),
    )
    worker = asyncio.get_running_loop().create_task(state.worker())

    async def _shutdown(_app: web.Application) -> None:
        await state.aclose(worker)
        state.engine.close()

    app.on_cleanup.append(_shutdown)
    return app, {}
