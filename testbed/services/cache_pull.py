"""Moving a cached prefix across the link as real bytes (the cache-aware rule's "transfer it").

When the cache-aware policy routes a request to PD-P while the longest prefix of its prompt sits
in the PrfaaS cluster, the router pulls that prefix before the prefill:

- a PrfaaS prefill instance (the source cluster holds the prefix in its pool) sends S_kv(p) for
  the p pulled tokens, layer by layer, with its KV sender (`POST /prefix/send`). Reading a
  cached prefix costs no compute, so the send does not queue behind the instance's prefills;
- it goes through the link proxy, the same shaped path PrfaaS KV takes, to the KV receiver of
  the decode instance the request will decode on (the destination cluster), where
  `POST /prefix/receive` waits for it and checks its size and checksums;
- on success the router inserts the prefix into the destination cluster's pool and the prefill
  starts from it; on any failure the prefill computes the prefix instead.

Only PrfaaS -> local pulls are carried: the emulated link shapes the PrfaaS -> PD direction
(where KV flows and bandwidth is scarce), and the PrfaaS cluster has no KV receiver. A route
that asks for a local -> PrfaaS pull is served without it (recorded as skipped): the PrfaaS
prefill computes from its own cluster's prefix.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any, Protocol

import aiohttp
from aiohttp import web

from testbed.engine.emulated import wire_layer_bytes
from testbed.profiles import MODELS
from testbed.services.spec import InstanceInfo, ServiceSpec
from testbed.services.validate import int_field, json_body, str_field
from testbed.transfer.errors import TransferError
from testbed.transfer.payload import PayloadSource
from testbed.transfer.receiver import KVReceiver
from testbed.transfer.sender import KVSender

__all__ = ["PullResult", "pull_prefix", "pull_wire_id", "receive_handler", "send_handler"]


class PrefixSource(Protocol):
    """What a prefill worker offers to send a cached prefix."""

    spec: ServiceSpec
    payload: PayloadSource

    async def sender(self, target: tuple[str, int]) -> KVSender: ...


class PrefixSink(Protocol):
    """What a decode worker offers to receive one."""

    spec: ServiceSpec
    receiver: KVReceiver


def pull_wire_id(wire_id: str) -> str:
    """The KV wire id of a request attempt's pull (<= 64 bytes: request ids are <= 60 bytes,
    attempt ids add ".N")."""
    return f"{wire_id}~p"


def send_handler(key: web.AppKey[Any]) -> Any:
    """`POST /prefix/send {id, tokens, kv_host, kv_port}` on a prefill worker: send S_kv(tokens)
    of a cached prefix to a KV receiver now; answers with the wire bytes sent."""

    async def handler(request: web.Request) -> web.Response:
        state: PrefixSource = request.app[key]
        body = await json_body(request)
        rid = str_field(body, "id", 64)
        tokens = int_field(body, "tokens", 1, 10_000_000)
        target = (str_field(body, "kv_host", 255), int_field(body, "kv_port", 1, 65535))
        sizes = wire_layer_bytes(MODELS[state.spec.model], tokens, state.spec.byte_scale)
        sent = 0
        try:
            sender = await state.sender(target)
            async with sender.open(rid, sizes) as tx:
                for layer, nbytes in enumerate(sizes):
                    await tx.send_layer(layer, state.payload.layer(rid, layer, nbytes))
                    sent += nbytes
        except (TransferError, OSError, TimeoutError) as exc:
            reason = exc.reason if isinstance(exc, TransferError) else repr(exc)
            return web.json_response(
                {"error": f"prefix send: {reason}", "kv_wire_bytes_sent": sent}, status=502
            )
        return web.json_response({"kv_wire_bytes_sent": sent})

    return handler


def receive_handler(key: web.AppKey[Any]) -> Any:
    """`POST /prefix/receive {id, expected_wire_bytes}` on a decode worker: wait for a pulled
    prefix's KV, check its size and checksums, then free it (the pool keeps the prefix)."""

    async def handler(request: web.Request) -> web.Response:
        state: PrefixSink = request.app[key]
        body = await json_body(request)
        rid = str_field(body, "id", 64)
        expected = int_field(body, "expected_wire_bytes", 0, 1 << 50)
        try:
            manifest = await state.receiver.wait(rid, state.spec.kv_timeout_s)
        except TransferError as exc:
            return web.json_response({"error": f"prefix transfer: {exc.reason}"}, status=502)
        except TimeoutError:
            return web.json_response({"error": "prefix transfer timed out"}, status=504)
        finally:
            state.receiver.discard(rid)
        if manifest.total_bytes != expected:
            return web.json_response(
                {"error": f"prefix size mismatch: got {manifest.total_bytes}, want {expected}"},
                status=502,
            )
        if not manifest.verified:
            return web.json_response({"error": "prefix not verified"}, status=502)
        return web.json_response({"kv_wire_bytes": manifest.total_bytes, "kv_verified": True})

    return handler


@dataclass(frozen=True)
class PullResult:
    ok: bool
    wire_bytes: int
    """Wire bytes the source sent (also on failure: they crossed the link)."""
    seconds: float
    """Real-world seconds from asking for the pull to its verified arrival (or failure)."""
    status: str
    """"ok", or "failed: <reason>"."""


async def _post(
    session: aiohttp.ClientSession, url: str, body: dict[str, Any], timeout: float
) -> dict[str, Any]:
    try:
        async with asyncio.timeout(timeout):
            async with session.post(url, json=body) as resp:
                doc: dict[str, Any] = await resp.json(content_type=None)
                if resp.status != 200 and "error" not in doc:
                    doc["error"] = f"HTTP {resp.status}"
                return doc
    except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
        return {"error": f"{url} unreachable ({type(exc).__name__})"}


async def pull_prefix(
    session: aiohttp.ClientSession,
    *,
    source: InstanceInfo,
    target: InstanceInfo,
    wire_id: str,
    tokens: int,
    model: str,
    byte_scale: float,
    time_scale: float,
    timeout_s: float,
) -> PullResult:
    """Move `tokens` of cached prefix from `source` (a PrfaaS prefill instance) through the link
    proxy to `target` (a local decode instance); bounded by `timeout_s` wall seconds. The
    instances' URLs are the router's: a switchable PD instance's points at its decode role."""
    if target.kv_link_host is None or target.kv_link_port is None:
        return PullResult(False, 0, 0.0, f"failed: {target.id} has no link address")
    expected = sum(wire_layer_bytes(MODELS[model], tokens, byte_scale))
    start = time.monotonic()
    receive = asyncio.create_task(
        _post(
            session,
            f"{target.url}/prefix/receive",
            {"id": wire_id, "expected_wire_bytes": expected},
            timeout_s,
        )
    )
    sent_doc = await _post(
        session,
        f"{source.url}/prefix/send",
        {
            "id": wire_id,
            "tokens": tokens,
            "kv_host": target.kv_link_host,
            "kv_port": target.kv_link_port,
        },
        timeout_s,
    )
    sent = int(sent_doc.get("kv_wire_bytes_sent", 0))
    if "error" in sent_doc:
        receive.cancel()
        await asyncio.gather(receive, return_exceptions=True)
        await _delete(session, f"{target.url}/decode/{wire_id}")
        seconds = (time.monotonic() - start) * time_scale
        return PullResult(False, sent, seconds, f"failed: {sent_doc['error']}")
    got = await receive
    seconds = (time.monotonic() - start) * time_scale
    if "error" in got:
        return PullResult(False, sent, seconds, f"failed: {got['error']}")
    return PullResult(True, sent, seconds, "ok")


async def _delete(session: aiohttp.ClientSession, url: str) -> None:
    """Free what a decode receiver holds of an abandoned pull (best effort)."""
    try:
        async with asyncio.timeout(5):
            async with session.delete(url):
                pass
    except (aiohttp.ClientError, TimeoutError):
        pass
