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
from typing import Any

from aiohttp import web

from testbed.services import cache_pull
from testbed.services.engines.base import PrefillAdapter
from testbed.services.exposition import add_metrics_route, worker_registry, worker_samples
from testbed.services.facade import add_prefill_routes
from testbed.services.kv_targets import targets_handler
from testbed.services.prefilling import PrefillJob, PrefillState
from testbed.services.spec import ServiceSpec
from testbed.services.validate import health, int_field, json_body, json_errors, str_field

__all__ = ["STATE", "PrefillJob", "PrefillState", "create_app"]


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
    if spec.facade is not None:  # an external router's PD handshake (docs/real-routers.md)
        add_prefill_routes(app, state)
    worker = asyncio.get_running_loop().create_task(state.worker())

    async def _shutdown(_app: web.Application) -> None:
        await state.aclose(worker)
        state.engine.close()

    app.on_cleanup.append(_shutdown)
    return app, {}
