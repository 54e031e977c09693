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

from testbed.clock import LiveClock
from testbed.profiles import MODELS
from testbed.services import cache_pull
from testbed.services.engines import decode_adapter
from testbed.services.engines.base import DecodeAdapter
from testbed.services.exposition import add_metrics_route, worker_registry, worker_samples
from testbed.services.kv_expect import EXPECTING, expect_kv, label_field
from testbed.services.spec import ServiceSpec
from testbed.services.validate import health, int_field, json_body, json_errors, str_field
from testbed.transfer.errors import TransferError
from testbed.transfer.reassembly import KVManifest
from testbed.transfer.receiver import KVReceiver, ReceiverStats

__all__ = ["STATE", "DecodeState", "FirstTokens", "create_app", "kv_accounting"]

MAX_PENDING_FIRST = 65536
"""First tokens remembered for requests whose decode call has not (or no longer) come."""


class FirstTokens:
    """First tokens the router forwards (engines that relay them), by wire id."""

    def __init__(self) -> None:
        self.futures: dict[str, asyncio.Future[int]] = {}

    def expect(self, rid: str) -> asyncio.Future[int]:
        """The future the router's first_token call resolves (whichever side comes first).

        A first token for a request whose decode already ended leaves an entry nobody pops;
        the oldest entries go once there are MAX_PENDING_FIRST, so that cannot grow unbounded.
        """
        fut = self.futures.get(rid)
        if fut is None:
            while len(self.futures) >= MAX_PENDING_FIRST:
                self.futures.pop(next(iter(self.futures))).cancel()
            fut = self.futures[rid] = asyncio.get_running_loop().create_future()
        return fut

    def forget(self, rid: str) -> None:
        self.futures.pop(rid, None)

    def cancel(self, rid: str) -> None:
        fut = self.futures.pop(rid, None)
        if fut is not None:
            fut.cancel()


class DecodeState:
    def __init__(self, spec: ServiceSpec, engine: DecodeAdapter[Any] | None = None) -> None:
        self.spec = spec
        self.clock = LiveClock.of(spec)
        self.bs_max = MODELS[spec.model].decode[spec.hardware].bs_max(spec.tpot_slo_s)
        self.engine = (
            engine if engine is not None else decode_adapter(spec, self.clock, self.bs_max)
        )
        self.receiver = KVReceiver(spec.host, spec.kv_port, keep_payload=self.engine.keep_payload)
        self.first_tokens = FirstTokens()
        self.waiting_kv = 0
        self.completed = 0
        self.failed = 0
        self.tokens_streamed = 0


STATE = web.AppKey("state", DecodeState)


def _when(mono: float | None) -> float:
    """A slot's token instant (set once it produced a token; a finished slot has both)."""
    assert mono is not None, "a finished decode slot has token times"
    return mono


async def _decode(request: web.Request) -> web.StreamResponse:
    state = request.app[STATE]
    engine = state.engine
    body = await json_body(request)
    rid = str_field(body, "id", 64)
    output_tokens = int_field(body, "output_tokens", 1, engine.max_output_tokens)
    expected = int_field(body, "expected_wire_bytes", 0, 1 << 50)
    label = label_field(body)
    skip = state.spec.unsafe_skip_kv_verify  # TEST-ONLY: see ServiceSpec.unsafe_skip_kv_verify
    resp = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})

    async def send(doc: dict[str, Any]) -> None:
        await resp.write((json.dumps(doc, separators=(",", ":")) + "\n").encode())

    async def fail(reason: str) -> web.StreamResponse:
        state.failed += 1
        await send({"error": reason})
        return resp

    clock = state.clock
    timeout = state.spec.kv_timeout_s
    expect_kv(state.receiver, rid, total_bytes=expected, timeout_s=timeout, label=label)
    first = state.first_tokens.expect(rid) if engine.relays_first_token else None
    layers: list[bytearray] | None = None
    first_token: int | None = None
    state.waiting_kv += 1
    try:
        try:
            await resp.prepare(request)
            await resp.write(EXPECTING)
            if skip:  # the KV may still arrive: the receiver frees it at its deadline
                manifest = KVManifest(rid, (), expected, False, 0.0, 0.0, 0, 0)
            else:
                manifest = await state.receiver.wait(rid, timeout)
                if engine.keep_payload:
                    layers = state.receiver.take_payload(rid)
        except TransferError as exc:
            return await fail(f"kv transfer failed: {exc.reason}")
        except KeyError as exc:  # complete but without its bytes: nothing to decode from
            return await fail(f"kv payload unavailable: {exc}")
        except TimeoutError:
            return await fail("kv transfer timed out at decode")
        finally:
            if not skip:
                state.receiver.discard(rid)
        if manifest.total_bytes != expected:
            return await fail(f"kv size mismatch: got {manifest.total_bytes}, want {expected}")
        if not manifest.verified and not skip:
            return await fail("kv not verified")
        if first is not None:
            try:
                first_token = await asyncio.wait_for(first, timeout)
            except TimeoutError:
                return await fail("first token never arrived from the router")
    finally:
        state.waiting_kv -= 1
        if first is not None:
            state.first_tokens.forget(rid)
    kv_ready = clock.now()
    pending: asyncio.Queue[int] = asyncio.Queue()
    handle = await engine.admit(rid, output_tokens, layers, first_token, pending.put_nowait)
    if isinstance(handle, str):  # intact bytes the engine cannot decode from
        return await fail(handle)
    await send(
        {"admitted": True, "kv_verified": manifest.verified, "kv_wire_bytes": manifest.total_bytes}
    )
    engine.submit(handle)
    streamed = 0
    try:
        while not (handle.done.is_set() and pending.empty()):
            getter = asyncio.ensure_future(pending.get())
            done_wait = asyncio.ensure_future(handle.done.wait())
            await asyncio.wait({getter, done_wait}, return_when=asyncio.FIRST_COMPLETED)
            done_wait.cancel()
            if getter.done():
                n = getter.result()
                while not pending.empty():
                    n += pending.get_nowait()
                streamed += n
                state.tokens_streamed += n
                line: dict[str, Any] = {"tokens": n}
                ids = engine.result(handle).get("token_ids")  # engine: torch, so far
                if ids is not None:  # the router streams the model's real text
                    line["ids"] = ids[streamed - n : streamed]
                await send(line)
            else:
                getter.cancel()
    finally:
        if not handle.done.is_set():
            engine.cancel(handle)
    error = engine.error(handle)
    if error is not None:
        return await fail(f"decode: {error}")
    state.completed += 1
    await send(
        {
            "done": True,
            "tokens": streamed,
            **engine.result(handle),
            "kv_ready": kv_ready,
            "first_token": clock.at(_when(handle.first_token_at)),
            "last_token": clock.at(_when(handle.last_token_at)),
            "kv_wire_bytes": manifest.total_bytes,
            "kv_verified": manifest.verified,
        }
    )
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
    batch_task = asyncio.get_running_loop().create_task(state.engine.run())

    async def _shutdown(_app: web.Application) -> None:
        batch_task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await batch_task
        await state.receiver.aclose()
        state.engine.close()

    app.on_cleanup.append(_shutdown)
    return app, {"kv": state.receiver.port}
