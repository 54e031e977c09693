"""The decode worker: receives KV, admits a request once its KV is complete and verified,
decodes it in a continuous batch and streams tokens back, coalesced.

`POST /decode` is called by the router when it dispatches a request, before any KV is sent; the
response is an NDJSON stream: first `{"expecting": true}` once the KV receiver accepts the
request's frames (services/kv_expect.py: the router starts the prefill only then), then
`{"admitted": true, ...}` once the KV is complete and verified, `{"tokens": n}` lines as tokens
are generated, then one final line with `done` (and the lifecycle times) or `error` (and the
reason). A request whose KV fails verification is never decoded.

The engine is an adapter (services.engines): `emulated` batches on the profile's step time;
`torch` rebuilds the tiny model's KV from the received bytes, waits for the first token the
prefill computed (the router forwards it: `POST /decode/{id}/first_token`) and adds the
generated `token_ids` to the final line.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any

from aiohttp import web

from testbed.services import cache_pull
from testbed.services.decoding import (
    DecodeFailed,
    DecodeState,
    FirstTokens,
    KVArrival,
    decode_tokens,
    receive_kv,
)
from testbed.services.engines.base import DecodeAdapter
from testbed.services.exposition import add_metrics_route, worker_registry, worker_samples
from testbed.services.facade import add_decode_routes
from testbed.services.kv_expect import EXPECTING, expect_kv, label_field
from testbed.services.spec import ServiceSpec
from testbed.services.validate import health, int_field, json_body, json_errors, str_field
from testbed.transfer.receiver import ReceiverStats

__all__ = [
    "STATE",
    "DecodeFailed",
    "DecodeState",
    "FirstTokens",
    "KVArrival",
    "create_app",
    "decode_tokens",
    "kv_accounting",
    "receive_kv",
]

STATE = web.AppKey("state", DecodeState)


async def _decode(request: web.Request) -> web.StreamResponse:
    state = request.app[STATE]
    engine = state.engine
    body = await json_body(request)
    rid = str_field(body, "id", 64)
    output_tokens = int_field(body, "output_tokens", 1, engine.max_output_tokens)
    expected = int_field(body, "expected_wire_bytes", 0, 1 << 50)
    label = label_field(body)
    resp = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})

    async def send(doc: dict[str, Any]) -> None:
        await resp.write((json.dumps(doc, separators=(",", ":")) + "\n").encode())

    async def expecting() -> None:
        await resp.prepare(request)
        await resp.write(EXPECTING)

    expect_kv(state.receiver, rid, total_bytes=expected, timeout_s=state.spec.kv_timeout_s,
              label=label)  # fmt: skip
    try:
        kv = await receive_kv(state, rid, expected, on_expecting=expecting)
        await send(await decode_tokens(state, rid, output_tokens, kv, send))
    except DecodeFailed as exc:
        state.failed += 1
        await send({"error": exc.reason})
    return resp


async def _first_token(request: web.Request) -> web.Response:
    """The router forwards the prefill's first token (the control path)."""
    state = request.app[STATE]
    body = await json_body(request)
    token = int_field(body, "first_token_id", 0, state.engine.vocab_size - 1)
    fut = state.first_tokens.expect(request.match_info["rid"])
    if not fut.done():
        fut.set_result(token)
    return web.json_response({"ok": True})


def kv_accounting(rx: ReceiverStats) -> dict[str, int]:
    """What the KV receiver holds and what it refused (for /stats and the flood bench)."""
    return {
        "kv_requests_tracked": rx.requests_tracked,
        "kv_requests_retired": rx.requests_retired,
        "kv_requests_expired": rx.requests_expired,
        "kv_payload_bytes": rx.payload_bytes,
        "kv_buffer_bytes": rx.buffer_bytes,
        "kv_frames_refused": rx.frames_refused,
        "kv_connections_open": rx.connections_open,
        "kv_connections_refused": rx.connections_refused,
    }


async def _cancel(request: web.Request) -> web.Response:
    state = request.app[STATE]
    rid = request.match_info["rid"]
    state.receiver.discard(rid)
    state.first_tokens.cancel(rid)
    return web.json_response({"ok": True})


async def _stats(request: web.Request) -> web.Response:
    return web.json_response(stats_doc(request.app[STATE]))


def stats_doc(state: DecodeState) -> dict[str, Any]:
    """What `/stats` answers (and `/metrics` exposes: services.exposition)."""
    engine = state.engine
    rx = state.receiver.stats()
    return {
        "id": state.spec.id,
        "cluster": state.spec.cluster,
        "role": "decode",
        **({"engine_kind": engine.kind} if engine.kind is not None else {}),
        "active": engine.active(),
        "waiting_batch": engine.waiting(),
        "waiting_kv": state.waiting_kv,
        "bs_max": state.bs_max,
        "completed": state.completed,
        "failed": state.failed,
        **engine.counters(),
        "kv_wire_bytes_received": rx.bytes_received,
        "kv_checksum_failures": rx.checksum_failures,
        **kv_accounting(rx),
        "engine": engine.stats(),
    }


async def create_app(
    spec: ServiceSpec, engine: DecodeAdapter[Any] | None = None
) -> tuple[web.Application, dict[str, int]]:
    """The decode worker's app; the engine is the spec's unless one is given."""
    state = DecodeState(spec, engine)
    await state.receiver.start()
    app = web.Application(client_max_size=1 << 20, middlewares=[json_errors])
    app[STATE] = state
    app.router.add_post("/decode", _decode)
    if state.engine.relays_first_token:
        app.router.add_post("/decode/{rid}/first_token", _first_token)
    app.router.add_delete("/decode/{rid}", _cancel)
    if state.engine.serves_prefix:
        app.router.add_post("/prefix/receive", cache_pull.receive_handler(STATE))
    app.router.add_get("/stats", _stats)
    app.router.add_get("/health", health)
    add_metrics_route(
        app,
        worker_registry(
            lambda: worker_samples(
                stats_doc(state),
                model=spec.model,
                byte_scale=spec.byte_scale,
                tokens=state.tokens_streamed,
            )
        ),
    )
    if spec.facade is not None:  # an external router's PD handshake (docs/real-routers.md)
        await add_decode_routes(app, state)
    batch_task = asyncio.get_running_loop().create_task(state.engine.run())

    async def _shutdown(_app: web.Application) -> None:
        batch_task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await batch_task
        await state.receiver.aclose()
        state.engine.close()

    app.on_cleanup.append(_shutdown)
    return app, {"kv": state.receiver.port}
