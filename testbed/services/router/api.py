"""The router's HTTP API: the aiohttp app over the dispatcher (services.router.dispatch).

`POST /generate` (NDJSON stream: `{"tokens": n}` lines, then `{"record": {...}}`),
`POST /v1/completions` (OpenAI-compatible: services.router.openai), `GET /history` (every
record), `GET /stats` (load, policy inputs, scheduler state), `GET /events` (the scheduler's
event stream: services.router.follow), `GET /health`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any

import aiohttp
from aiohttp import web

from testbed.kvcache import BLOCK_TOKENS
from testbed.services.router.dispatch import RouterState
from testbed.services.router.follow import FOLLOWERS, Follower, events
from testbed.services.router.intake import (
    STATE,
    api_error,
    claim,
    positive_int,
    read_body,
    token_sink,
)
from testbed.services.router.openai import MAX_INPUT_TOKENS, MAX_OUTPUT_TOKENS, completions
from testbed.services.router.workers import Workers
from testbed.services.spec import ServiceSpec
from testbed.services.validate import health, json_errors

__all__ = ["create_app"]

TASKS = web.AppKey("tasks", list[asyncio.Task[None]])


async def _generate(request: web.Request) -> web.StreamResponse:
    state = request.app[STATE]
    body = await read_body(request)
    input_tokens = positive_int(body, "input_tokens", MAX_INPUT_TOKENS)
    output_tokens = positive_int(body, "output_tokens", MAX_OUTPUT_TOKENS)
    hash_ids = _hash_ids(body, input_tokens)
    rid = claim(state, body)  # last: a request refused for bad fields does not use up its id
    resp = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
    await resp.prepare(request)
    on_tokens = token_sink(resp, lambda n: b'{"tokens":%d}\n' % n)
    rec = await state.handle(rid, input_tokens, output_tokens, on_tokens, hash_ids)
    with contextlib.suppress(ConnectionError, aiohttp.ClientConnectionResetError):
        await resp.write((json.dumps({"record": rec.to_json()}) + "\n").encode())
    return resp


def _hash_ids(body: dict[str, Any], input_tokens: int) -> tuple[int, ...]:
    """The optional `hash_ids` of a Mooncake-style request: one id per 512-token block of the
    prompt (the last may be partial), so at most ceil(input_tokens / 512) signed 64-bit ints.
    Checked before the response starts, so a bad list is a 400, not a failed request."""
    value = body.get("hash_ids")
    if value is None:
        return ()
    limit = -(-input_tokens // BLOCK_TOKENS)
    if not isinstance(value, list) or len(value) > limit:
        raise api_error(
            f"hash_ids must be a list of at most ceil(input_tokens / 512) = {limit} ints"
        )
    if not all(
        isinstance(h, int) and not isinstance(h, bool) and -(2**63) <= h < 2**63 for h in value
    ):
        raise api_error("hash_ids must hold only integers (signed 64-bit)")
    return tuple(value)


async def _history(request: web.Request) -> web.Response:
    return web.json_response([r.to_json() for r in request.app[STATE].records])


async def _stats(request: web.Request) -> web.Response:
    state = request.app[STATE]
    snap = state.snapshot()
    sched = state.scheduler
    return web.json_response(
        {
            "now": snap.now,
            "in_flight": state.in_flight,
            "recorded": len(state.records),
            "threshold_tokens": snap.threshold_tokens,
            "bandwidth_scarce": snap.bandwidth_scarce,
            "n_prefill_local": sum(
                1 for i in state.instances.values() if i.cluster == "local" and i.role == "prefill"
            ),
            "draining": sorted(sched.draining),
            "bandwidth_estimate_gbps": sched.bandwidth_estimate_gbps,
            "events_seq": sched.seq,
            "prefix_cache": None if state.cache is None else state.cache.stats(),
            "instances": [
                {
                    "id": i.id,
                    "cluster": i.cluster,
                    "role": i.role,
                    "outstanding": i.outstanding,
                    "outstanding_work": i.outstanding_work,
                }
                for i in snap.instances
            ],
        }
    )


async def create_app(
    spec: ServiceSpec, workers: Workers | None = None
) -> tuple[web.Application, dict[str, int]]:
    """The router's app; `workers` replaces its HTTP calls to the instances (tests)."""
    state = RouterState(spec, workers)
    app = web.Application(client_max_size=1 << 20, middlewares=[json_errors])
    app[STATE] = state
    app[FOLLOWERS] = set[Follower]()
    app.router.add_post("/generate", _generate)
    app.router.add_post("/v1/completions", completions)
    app.router.add_get("/history", _history)
    app.router.add_get("/stats", _stats)
    app.router.add_get("/events", events)
    app.router.add_get("/health", health)

    async def _startup(_app: web.Application) -> None:
        await state.open()
        loop = asyncio.get_running_loop()
        tasks = [loop.create_task(state.watch_health())]
        if state.control is not None:
            tasks.append(loop.create_task(state.control.run_short_term()))
            if state.control.long is not None:
                tasks.append(loop.create_task(state.control.run_long_term()))
        app[TASKS] = tasks

    async def _closing(_app: web.Application) -> None:
        state.closing = True  # handlers cancelled from here on: "router shut down"
        for follower in app[FOLLOWERS]:  # event streams end instead of holding the shutdown
            follower.end()

    async def _shutdown(_app: web.Application) -> None:
        for task in app.get(TASKS, []):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await state.aclose()

    app.on_startup.append(_startup)
    app.on_shutdown.append(_closing)
    app.on_cleanup.append(_shutdown)
    return app, {}
