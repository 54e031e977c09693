"""What a decode worker is, whatever API it is called through: its state (the engine, the KV
receiver, the counters) and the two steps of one request, `receive_kv` (wait for the KV, check
it) and `decode_tokens` (admit, batch, stream). Our router's `POST /decode` (services.decode)
and the router-facing API of external routers (services.facade) both run these steps, so a
request is decoded by the same rules whichever router sent it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from testbed.clock import LiveClock
from testbed.profiles import MODELS
from testbed.services.engines import decode_adapter
from testbed.services.engines.base import DecodeAdapter
from testbed.services.spec import ServiceSpec
from testbed.transfer.errors import TransferError
from testbed.transfer.reassembly import KVManifest
from testbed.transfer.receiver import KVReceiver

__all__ = [
    "MAX_PENDING_FIRST",
    "DecodeFailed",
    "DecodeState",
    "FirstTokens",
    "KVArrival",
    "LineSink",
    "decode_tokens",
    "receive_kv",
]

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


def _when(mono: float | None) -> float:
    """A slot's token instant (set once it produced a token; a finished slot has both)."""
    assert mono is not None, "a finished decode slot has token times"
    return mono


class DecodeFailed(Exception):
    """A decode that cannot go on, with the reason the requester is told."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass
class KVArrival:
    """A request's KV, complete and checked (`receive_kv`)."""

    manifest: KVManifest
    layers: list[bytearray] | None
    first_token: int | None
    ready: float
    """When it was ready (real-world seconds on the run's clock)."""


LineSink = Callable[[dict[str, Any]], Awaitable[None]]


async def receive_kv(
    state: DecodeState,
    rid: str,
    expected: int,
    *,
    on_expecting: Callable[[], Awaitable[None]] | None = None,
    gone: Awaitable[str] | None = None,
) -> KVArrival:
    """Wait for request `rid`'s KV (registered with `expect_kv`), check it and free the
    receiver's entry; DecodeFailed with the reason otherwise. `on_expecting` runs once the
    receiver expects it; `gone` (if given) ends the wait early with its reason: the sender is
    known to have failed (the router-facing API's bootstrap: services.facade)."""
    engine = state.engine
    skip = state.spec.unsafe_skip_kv_verify  # TEST-ONLY: see ServiceSpec.unsafe_skip_kv_verify
    timeout = state.spec.kv_timeout_s
    first = state.first_tokens.expect(rid) if engine.relays_first_token else None
    layers: list[bytearray] | None = None
    first_token: int | None = None
    state.waiting_kv += 1
    try:
        try:
            if on_expecting is not None:
                await on_expecting()
            if skip:  # the KV may still arrive: the receiver frees it at its deadline
                manifest = KVManifest(rid, (), expected, False, 0.0, 0.0, 0, 0)
            else:
                manifest = await _wait_kv(state, rid, timeout, gone)
                if engine.keep_payload:
                    layers = state.receiver.take_payload(rid)
        except TransferError as exc:
            raise DecodeFailed(f"kv transfer failed: {exc.reason}") from None
        except KeyError as exc:  # complete but without its bytes: nothing to decode from
            raise DecodeFailed(f"kv payload unavailable: {exc}") from None
        except TimeoutError:
            raise DecodeFailed("kv transfer timed out at decode") from None
        finally:
            if not skip:
                state.receiver.discard(rid)
        if manifest.total_bytes != expected:
            raise DecodeFailed(f"kv size mismatch: got {manifest.total_bytes}, want {expected}")
        if not manifest.verified and not skip:
            raise DecodeFailed("kv not verified")
        if first is not None:
            try:
                first_token = await asyncio.wait_for(first, timeout)
            except TimeoutError:
                raise DecodeFailed("first token never arrived from the router") from None
    finally:
        state.waiting_kv -= 1
        if first is not None:
            state.first_tokens.forget(rid)
    return KVArrival(manifest, layers, first_token, state.clock.now())


async def _wait_kv(
    state: DecodeState, rid: str, timeout: float, gone: Awaitable[str] | None
) -> KVManifest:
    """The receiver's wait, cut short by `gone` when the sender is known to have failed."""
    if gone is None:
        return await state.receiver.wait(rid, timeout)
    waiter = asyncio.ensure_future(state.receiver.wait(rid, timeout))
    sender = asyncio.ensure_future(gone)
    try:
        await asyncio.wait({waiter, sender}, return_when=asyncio.FIRST_COMPLETED)
        if waiter.done():
            return waiter.result()
        raise DecodeFailed(sender.result())
    finally:
        for fut in (waiter, sender):
            if not fut.done():
                fut.cancel()
        await asyncio.gather(waiter, sender, return_exceptions=True)


async def decode_tokens(
    state: DecodeState,
    rid: str,
    output_tokens: int,
    kv: KVArrival,
    send: LineSink,
    on_admitted: Callable[[], Awaitable[None]] | None = None,
) -> dict[str, Any]:
    """Decode a request whose KV arrived: `send` gets the `{"admitted"...}` line, then one
    `{"tokens": n}` line per coalesced chunk; returns the final line's fields (`done`, the
    token times) or raises DecodeFailed. `on_admitted` runs before the admitted line."""
    engine = state.engine
    clock = state.clock
    pending: asyncio.Queue[int] = asyncio.Queue()
    handle = await engine.admit(rid, output_tokens, kv.layers, kv.first_token, pending.put_nowait)
    if isinstance(handle, str):  # intact bytes the engine cannot decode from
        raise DecodeFailed(handle)
    manifest = kv.manifest
    if on_admitted is not None:
        await on_admitted()
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
        raise DecodeFailed(f"decode: {error}")
    state.completed += 1
    return {
        "done": True,
        "tokens": streamed,
        **engine.result(handle),
        "kv_ready": kv.ready,
        "first_token": clock.at(_when(handle.first_token_at)),
        "last_token": clock.at(_when(handle.last_token_at)),
        "kv_wire_bytes": manifest.total_bytes,
        "kv_verified": manifest.verified,
    }
