"""The decode worker with the tiny real model (`engine: torch`): same API as services/decode.py,
but it continues from the received KV bytes and streams real token ids.

Per request (`POST /decode`, NDJSON answer as in decode.py):

1. register the request's wire id with the KV receiver and answer `{"expecting": true}` (the
   router starts the prefill only then, services/kv_expect.py), then wait until its KV is
   complete and every frame's checksum verified (the receiver keeps the payload:
   `keep_payload=True`); a failed or corrupt transfer ends the request with the receiver's
   reason;
2. wait for the first output token, which prefill computed and the router forwards with
   `POST /decode/{id}/first_token` once the prefill has answered (the control path);
3. rebuild the KV from the bytes (`TorchDecodeEngine.restore`); a `KVFormatError` (KV from another
   model, a short or misplaced layer) ends the request with its reason: never decoded;
4. join the batch: every step decodes one token for each active request, one after another on
   a one-thread executor (the event loop keeps receiving KV meanwhile), and the step is padded to
   the profile's T_decode(batch) / time_scale (or counted late), like the emulated batcher;
5. the final line carries `token_ids`: the first token and every decoded one.

Batching is sequential per request (no stacked batched kernel yet), so a step's compute grows
with the batch while its budget grows much less: at a high time_scale most steps are late, and
the pacer's statistics (the `engine` section of /stats) say so. torch is imported in
`create_app` only, so importing this module needs no torch.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from aiohttp import web

from testbed.clock import LiveClock
from testbed.engine.torch.live import tiny_config
from testbed.engine.torch.pacing import CpuPacer, ProfileBudget
from testbed.profiles import MODELS
from testbed.services.decode import kv_accounting
from testbed.services.kv_expect import EXPECTING, expect_kv, label_field
from testbed.services.spec import ServiceSpec
from testbed.services.validate import health, int_field, json_body, json_errors, str_field
from testbed.transfer.errors import TransferError
from testbed.transfer.receiver import KVReceiver

if TYPE_CHECKING:
    from testbed.engine.torch.engine import TorchDecodeEngine
    from testbed.engine.torch.kvstate import KVState

__all__ = ["create_app"]

MAX_PENDING_FIRST = 65536
"""First tokens remembered for requests whose decode call has not (or no longer) come."""


@dataclass
class TorchSlot:
    """One request in (or waiting for) the decode batch."""

    request_id: str
    state: KVState
    ids: list[int]
    """[first token, decoded tokens...]; the last one is the next step's input."""
    output_tokens: int
    emitted: asyncio.Queue[int] = field(default_factory=asyncio.Queue)
    done: asyncio.Event = field(default_factory=asyncio.Event)
    first_token_at: float | None = None
    last_token_at: float | None = None
    error: str | None = None


class TorchDecodeState:
    def __init__(self, spec: ServiceSpec, engine: TorchDecodeEngine, executor: ThreadPoolExecutor):
        self.spec = spec
        self.clock = LiveClock.of(spec)
        self.engine = engine
        self.config = engine.model.config
        self.executor = executor
        profile = MODELS[spec.model]
        self.bs_max = profile.decode[spec.hardware].bs_max(spec.tpot_slo_s)
        self.budget = ProfileBudget(profile, spec.hardware, spec.hardware, self.config.n_layers)
        self.pacer = CpuPacer(self.clock)
        self.receiver = KVReceiver(spec.host, spec.kv_port, keep_payload=True)
        self.first_tokens: dict[str, asyncio.Future[int]] = {}
        self.active: list[TorchSlot] = []
        self.waiting: deque[TorchSlot] = deque()
        self.wake = asyncio.Event()
        self.waiting_kv = 0
        self.completed = 0
        self.failed = 0
        self.kv_rejected = 0
        """Requests whose verified KV did not fit the model (KVFormatError): never decoded."""

    def first_token(self, rid: str) -> asyncio.Future[int]:
        """The future the router's first_token call resolves (whichever side comes first).

        A first token for a request whose decode already ended leaves an entry nobody pops;
        the oldest entries go once there are MAX_PENDING_FIRST, so that cannot grow unbounded.
        """
        fut = self.first_tokens.get(rid)
        if fut is None:
            while len(self.first_tokens) >= MAX_PENDING_FIRST:
                self.first_tokens.pop(next(iter(self.first_tokens))).cancel()
            fut = self.first_tokens[rid] = asyncio.get_running_loop().create_future()
        return fut

    def submit(self, slot: TorchSlot) -> None:
        now = time.monotonic()
        slot.first_token_at = slot.last_token_at = now
        slot.emitted.put_nowait(1)  # the first token came with the request (from prefill)
        if len(slot.ids) >= slot.output_tokens:
            slot.done.set()
            return
        self.waiting.append(slot)
        self.wake.set()

    def cancel(self, slot: TorchSlot) -> None:
        with contextlib.suppress(ValueError):
            self.active.remove(slot)
        with contextlib.suppress(ValueError):
            self.waiting.remove(slot)

    def _step_all(self, batch: list[TorchSlot]) -> list[int | str]:
        """One decode step for each request (runs on the executor thread)."""
        out: list[int | str] = []
        for slot in batch:
            try:
                out.append(self.engine.model.decode_step(slot.state, slot.ids[-1]))
            except ValueError as exc:  # e.g. the context is full: that request fails alone
                out.append(str(exc))
        return out

    async def run(self) -> None:
        """Continuous batching up to bs_max, one paced step at a time."""
        loop = asyncio.get_running_loop()
        while True:
            while self.waiting and len(self.active) < self.bs_max:
                self.active.append(self.waiting.popleft())
            if not self.active:
                self.wake.clear()
                await self.wake.wait()
                continue
            batch = list(self.active)
            started = time.monotonic()
            results = await loop.run_in_executor(self.executor, self._step_all, batch)
            await self.pacer.pace("decode_step", started, self.budget.decode_step_s(len(batch)))
            now = time.monotonic()
            for slot, tok in zip(batch, results, strict=True):
                if slot not in self.active:  # cancelled while the step ran
                    continue
                if isinstance(tok, str):
                    slot.error = tok
                else:
                    slot.ids.append(tok)
                    slot.last_token_at = now
                    slot.emitted.put_nowait(1)
                if slot.error is not None or len(slot.ids) >= slot.output_tokens:
                    self.active.remove(slot)
                    slot.done.set()


STATE = web.AppKey("state", TorchDecodeState)


def _when(mono: float | None) -> float:
    """A slot's token instant (set once it produced a token; a finished slot has both)."""
    assert mono is not None, "a finished decode slot has token times"
    return mono


async def _decode(request: web.Request) -> web.StreamResponse:
    state = request.app[STATE]
    body = await json_body(request)
    rid = str_field(body, "id", 64)
    output_tokens = int_field(body, "output_tokens", 1, state.config.max_positions)
    expected = int_field(body, "expected_wire_bytes", 0, 1 << 50)
    label = label_field(body)
    resp = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})

    async def send(doc: dict[str, Any]) -> None:
        await resp.write((json.dumps(doc, separators=(",", ":")) + "\n").encode())

    async def fail(reason: str) -> web.StreamResponse:
        state.failed += 1
        await send({"error": reason})
        return resp

    timeout = state.spec.kv_timeout_s
    expect_kv(state.receiver, rid, total_bytes=expected, timeout_s=timeout, label=label)
    first = state.first_token(rid)
    state.waiting_kv += 1
    try:
        try:
            await resp.prepare(request)
            await resp.write(EXPECTING)
            manifest = await state.receiver.wait(rid, timeout)
            layers = state.receiver.take_payload(rid)
        except TransferError as exc:
            return await fail(f"kv transfer failed: {exc.reason}")
        except KeyError as exc:  # complete but without its bytes: nothing to decode from
            return await fail(f"kv payload unavailable: {exc}")
        except TimeoutError:
            return await fail("kv transfer timed out at decode")
        finally:
            state.receiver.discard(rid)
        if manifest.total_bytes != expected:
            return await fail(f"kv size mismatch: got {manifest.total_bytes}, want {expected}")
        if not manifest.verified:
            return await fail("kv not verified")
        try:
            first_token = await asyncio.wait_for(first, timeout)
        except TimeoutError:
            return await fail("first token never arrived from the router")
    finally:
        state.waiting_kv -= 1
        state.first_tokens.pop(rid, None)
    kv_ready = state.clock.now()
    from testbed.engine.torch.codec import KVFormatError

    try:
        kv = await asyncio.get_running_loop().run_in_executor(
            state.executor, state.engine.restore, layers
        )
    except KVFormatError as exc:  # intact bytes that are not this model's KV: never decoded
        state.kv_rejected += 1
        return await fail(f"kv rejected: {exc}")
    if kv.n_tokens + output_tokens - 1 > state.config.max_positions:
        return await fail(
            f"{kv.n_tokens} prompt + {output_tokens} output tokens exceed the model's context "
            f"({state.config.max_positions})"
        )
    await send({"admitted": True, "kv_verified": manifest.verified, "kv_wire_bytes": expected})
    slot = TorchSlot(rid, kv, [first_token], output_tokens)
    state.submit(slot)
    streamed = 0
    try:
        while not (slot.done.is_set() and slot.emitted.empty()):
            getter = asyncio.ensure_future(slot.emitted.get())
            done_wait = asyncio.ensure_future(slot.done.wait())
            await asyncio.wait({getter, done_wait}, return_when=asyncio.FIRST_COMPLETED)
            done_wait.cancel()
            if getter.done():
                n = getter.result()
                while not slot.emitted.empty():
                    n += slot.emitted.get_nowait()
                streamed += n
                await send({"tokens": n})
            else:
                getter.cancel()
    finally:
        if not slot.done.is_set():
            state.cancel(slot)
    if slot.error is not None:
        return await fail(f"decode: {slot.error}")
    state.completed += 1
    await send(
        {
            "done": True,
            "tokens": streamed,
            "token_ids": slot.ids,
            "kv_ready": kv_ready,
            "first_token": state.clock.at(_when(slot.first_token_at)),
            "last_token": state.clock.at(_when(slot.last_token_at)),
            "kv_wire_bytes": manifest.total_bytes,
            "kv_verified": manifest.verified,
        }
    )
    return resp


async def _first_token(request: web.Request) -> web.Response:
    """The router forwards the prefill's first token (the control path)."""
    state = request.app[STATE]
    body = await json_body(request)
    token = int_field(body, "first_token_id", 0, state.config.vocab_size - 1)
    fut = state.first_token(request.match_info["rid"])
    if not fut.done():
        fut.set_result(token)
    return web.json_response({"ok": True})


async def _cancel(request: web.Request) -> web.Response:
    state = request.app[STATE]
    rid = request.match_info["rid"]
    state.receiver.discard(rid)
    fut = state.first_tokens.pop(rid, None)
    if fut is not None:
        fut.cancel()
    return web.json_response({"ok": True})


async def _stats(request: web.Request) -> web.Response:
    state = request.app[STATE]
    rx = state.receiver.stats()
    return web.json_response(
        {
            "id": state.spec.id,
            "role": "decode",
            "engine_kind": "torch",
            "active": len(state.active),
            "waiting_batch": len(state.waiting),
            "waiting_kv": state.waiting_kv,
            "bs_max": state.bs_max,
            "completed": state.completed,
            "failed": state.failed,
            "kv_rejected": state.kv_rejected,
            "kv_wire_bytes_received": rx.bytes_received,
            "kv_checksum_failures": rx.checksum_failures,
            **kv_accounting(rx),
            "engine": state.pacer.stats(),
        }
    )


def build_engine(spec: ServiceSpec) -> TorchDecodeEngine:
    """The instance's model (same seed and dtype as every prefill of the run)."""
    import torch

    from testbed.engine.torch.engine import TorchDecodeEngine
    from testbed.engine.torch.model import TinyHybridLM

    # Per-op overhead dominates the tiny model: one intra-op thread (see torch_prefill.py).
    torch.set_num_threads(1)
    return TorchDecodeEngine(TinyHybridLM(tiny_config(spec.model_seed, spec.model_dtype)))


async def create_app(spec: ServiceSpec) -> tuple[web.Application, dict[str, int]]:
    executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"torch-{spec.id}")
    state = TorchDecodeState(spec, build_engine(spec), executor)
    await state.receiver.start()
    app = web.Application(client_max_size=1 << 20, middlewares=[json_errors])
    app[STATE] = state
    app.router.add_post("/decode", _decode)
    app.router.add_post("/decode/{rid}/first_token", _first_token)
    app.router.add_delete("/decode/{rid}", _cancel)
    app.router.add_get("/stats", _stats)
    app.router.add_get("/health", health)
    batch_task = asyncio.get_running_loop().create_task(state.run())

    async def _shutdown(_app: web.Application) -> None:
        batch_task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await batch_task
        await state.receiver.aclose()
        executor.shutdown(wait=False, cancel_futures=True)

    app.on_cleanup.append(_shutdown)
    return app, {"kv": state.receiver.port}
