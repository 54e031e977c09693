"""The decode worker: receives KV, admits a request once its KV is complete and verified,
decodes it in a continuous batch and streams tokens back, coalesced.

`POST /decode` is called by the router when it dispatches a request, before any KV is sent; the
response is an NDJSON stream: first `{"expecting": true}` once the KV receiver accepts the
request's frames (services/kv_expect.py: the router starts the prefill only then), then
`{"tokens": n}` lines as tokens are generated, then one final line with `done` (and the
lifecycle times) or `error` (and the reason). A request whose KV fails verification is never
decoded.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any

from aiohttp import web

from testbed.clock import LiveClock
from testbed.engine.emulated import DecodeBatcher, DecodeSlot
from testbed.profiles import MODELS
from testbed.services import cache_pull
from testbed.services.kv_expect import EXPECTING, expect_kv, label_field
from testbed.services.spec import ServiceSpec
from testbed.services.validate import health, int_field, json_body, json_errors, str_field
from testbed.transfer.errors import TransferError
from testbed.transfer.reassembly import KVManifest
from testbed.transfer.receiver import KVReceiver, ReceiverStats

__all__ = ["create_app", "kv_accounting"]

SPEC = web.AppKey("spec", ServiceSpec)


class DecodeState:
    def __init__(self, spec: ServiceSpec) -> None:
        self.spec = spec
        self.clock = LiveClock.of(spec)
        profile = MODELS[spec.model].decode[spec.hardware]
        self.bs_max = profile.bs_max(spec.tpot_slo_s)
        self.batcher = DecodeBatcher(
            profile.step_time, self.bs_max, self.clock, spec.flush_interval_s
        )
        self.receiver = KVReceiver(spec.host, spec.kv_port)
        self.waiting_kv = 0
        self.completed = 0
        self.failed = 0


STATE = web.AppKey("state", DecodeState)


def _when(mono: float | None) -> float:
    """A slot's token instant (set once it produced a token; a finished slot has both)."""
    assert mono is not None, "a finished decode slot has token times"
    return mono


async def _decode(request: web.Request) -> web.StreamResponse:
    state = request.app[STATE]
    body = await json_body(request)
    rid = str_field(body, "id", 64)
    output_tokens = int_field(body, "output_tokens", 1, 1_000_000)
    expected = int_field(body, "expected_wire_bytes", 0, 1 << 50)
    label = label_field(body)
    skip = state.spec.unsafe_skip_kv_verify  # TEST-ONLY: see ServiceSpec.unsafe_skip_kv_verify
    resp = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})

    async def send(doc: dict[str, Any]) -> None:
        await resp.write((json.dumps(doc, separators=(",", ":")) + "\n").encode())

    clock = state.clock
    timeout = state.spec.kv_timeout_s
    expect_kv(state.receiver, rid, total_bytes=expected, timeout_s=timeout, label=label)
    state.waiting_kv += 1
    try:
        await resp.prepare(request)
        await resp.write(EXPECTING)
        if skip:  # the KV may still arrive: the receiver frees it at its deadline
            manifest = KVManifest(rid, (), expected, False, 0.0, 0.0, 0, 0)
        else:
            manifest = await state.receiver.wait(rid, timeout)
    except TransferError as exc:
        state.failed += 1
        await send({"error": f"kv transfer failed: {exc.reason}"})
        return resp
    except TimeoutError:
        state.failed += 1
        await send({"error": "kv transfer timed out at decode"})
        return resp
    finally:
        state.waiting_kv -= 1
        if not skip:
            state.receiver.discard(rid)
    if manifest.total_bytes != expected:
        state.failed += 1
        await send({"error": f"kv size mismatch: got {manifest.total_bytes}, want {expected}"})
        return resp
    if not manifest.verified and not state.spec.unsafe_skip_kv_verify:
        state.failed += 1
        await send({"error": "kv not verified"})
        return resp
    kv_ready = clock.now()
    await send(
        {"admitted": True, "kv_verified": manifest.verified, "kv_wire_bytes": manifest.total_bytes}
    )
    pending: asyncio.Queue[int] = asyncio.Queue()
    slot = DecodeSlot(rid, output_tokens, emit=lambda k, _t: pending.put_nowait(k))
    state.batcher.submit(slot)
    try:
        while not (slot.done.is_set() and pending.empty()):
            getter = asyncio.ensure_future(pending.get())
            done_wait = asyncio.ensure_future(slot.done.wait())
            await asyncio.wait({getter, done_wait}, return_when=asyncio.FIRST_COMPLETED)
            done_wait.cancel()
            if getter.done():
                n = getter.result()
                while not pending.empty():
                    n += pending.get_nowait()
                await send({"tokens": n})
            else:
                getter.cancel()
    finally:
        if not slot.done.is_set():
            state.batcher.cancel(slot)
    state.completed += 1
    await send(
        {
            "done": True,
            "tokens": slot.generated,
            "kv_ready": kv_ready,
            "first_token": clock.at(_when(slot.first_token_at)),
            "last_token": clock.at(_when(slot.last_token_at)),
            "kv_wire_bytes": manifest.total_bytes,
            "kv_verified": manifest.verified,
        }
    )
    return resp


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
    request.app[STATE].receiver.discard(request.match_info["rid"])
    return web.json_response({"ok": True})


async def _stats(request: web.Request) -> web.Response:
    state = request.app[STATE]
    rx = state.receiver.stats()
    return web.json_response(
        {
            "id": state.spec.id,
            "role": "decode",
            "active": len(state.batcher.active),
            "waiting_batch": len(state.batcher.waiting),
            "waiting_kv": state.waiting_kv,
            "bs_max": state.bs_max,
            "completed": state.completed,
            "failed": state.failed,
            "kv_wire_bytes_received": rx.bytes_received,
            "kv_checksum_failures": rx.checksum_failures,
            **kv_accounting(rx),
            "engine": state.batcher.timing.stats(),
        }
    )


async def create_app(spec: ServiceSpec) -> tuple[web.Application, dict[str, int]]:
    state = DecodeState(spec)
    await state.receiver.start()
    app = web.Application(client_max_size=1 << 20, middlewares=[json_errors])
    app[SPEC] = spec
    app[STATE] = state
    app.router.add_post("/decode", _decode)
    app.router.add_delete("/decode/{rid}", _cancel)
    app.router.add_post("/prefix/receive", cache_pull.receive_handler(STATE))
    app.router.add_get("/stats", _stats)
    app.router.add_get("/health", health)
    batch_task = asyncio.get_running_loop().create_task(state.batcher.run())

    async def _shutdown(_app: web.Application) -> None:
        batch_task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await batch_task
        await state.receiver.aclose()

    app.on_cleanup.append(_shutdown)
    return app, {"kv": state.receiver.port}
