"""Moving a cached prefix across the link as real bytes (the cache-aware rule's "transfer it").

When the cache-aware policy routes a request to PD-P while the longest prefix of its prompt sits
in the PrfaaS cluster, the router pulls that prefix before the prefill:

- a PrfaaS prefill instance (the source cluster holds the prefix in its pool) sends S_kv(p) for
  the p pulled tokens, layer by layer, with its KV sender (`POST /prefix/send`). Reading a
  cached prefix costs no compute, so the send does not queue behind the instance's prefills;
- it goes through the link proxy, the same shaped path PrfaaS KV takes, to the KV receiver of
  the decode instance the request will decode on (the destination cluster), where
  `POST /prefix/receive` registers the pull with the receiver, answers `{"expecting": true}`
  (the router asks for the send only then: frames for ids not expected are refused), waits for
  it and checks its size and checksums;
- the pull travels under its own unguessable wire id (transfer/capability.py), and the source
  sends only to KV receivers its deployment knows (services/kv_targets.py);
- on success the router inserts the prefix into the destination cluster's pool and the prefill
  starts from it; on any failure the prefill computes the prefix instead.

Only PrfaaS -> local pulls are carried: the emulated link shapes the PrfaaS -> PD direction
(where KV flows and bandwidth is scarce), and the PrfaaS cluster has no KV receiver. A route
that asks for a local -> PrfaaS pull is served without it (recorded as skipped): the PrfaaS
prefill computes from its own cluster's prefix.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from dataclasses import dataclass
from typing import Any, Protocol

import aiohttp
from aiohttp import web

from testbed.clock import Clock
from testbed.engine.emulated import wire_layer_bytes
from testbed.profiles import MODELS
from testbed.services.kv_expect import EXPECTING, REGISTER_TIMEOUT_S, expect_kv, label_field
from testbed.services.kv_targets import NO_TARGETS_STATUS, KVTargets, post_targets
from testbed.services.spec import InstanceInfo, ServiceSpec
from testbed.services.validate import int_field, json_body, str_field
from testbed.transfer.capability import new_wire_id
from testbed.transfer.errors import TransferError
from testbed.transfer.payload import PayloadSource
from testbed.transfer.receiver import KVReceiver
from testbed.transfer.sender import KVSender

__all__ = ["PullResult", "pull_prefix", "receive_handler", "send_handler"]


class PrefixSource(Protocol):
    """What a prefill worker offers to send a cached prefix."""

    spec: ServiceSpec
    targets: KVTargets

    async def sender(self, target: tuple[str, int]) -> KVSender: ...


class PrefixSink(Protocol):
    """What a decode worker offers to receive one."""

    spec: ServiceSpec
    receiver: KVReceiver


def send_handler(key: web.AppKey[Any], payload: PayloadSource) -> Any:
    """`POST /prefix/send {id, tokens, kv_host, kv_port}` on a prefill worker: send S_kv(tokens)
    of a cached prefix (bytes from `payload`) to a KV receiver now; answers with the wire bytes
    sent."""

    async def handler(request: web.Request) -> web.Response:
        state: PrefixSource = request.app[key]
        body = await json_body(request)
        rid = str_field(body, "id", 64)
        tokens = int_field(body, "tokens", 1, 10_000_000)
        target = (str_field(body, "kv_host", 255), int_field(body, "kv_port", 1, 65535))
        state.targets.check(target)
        sizes = wire_layer_bytes(MODELS[state.spec.model], tokens, state.spec.byte_scale)
        sent = 0
        try:
            sender = await state.sender(target)
            async with sender.open(rid, sizes) as tx:
                for layer, nbytes in enumerate(sizes):
                    await tx.send_layer(layer, payload.layer(rid, layer, nbytes))
                    sent += nbytes
        except (TransferError, OSError, TimeoutError) as exc:
            reason = exc.reason if isinstance(exc, TransferError) else repr(exc)
            return web.json_response(
                {"error": f"prefix send: {reason}", "kv_wire_bytes_sent": sent}, status=502
            )
        return web.json_response({"kv_wire_bytes_sent": sent})

    return handler


def receive_handler(key: web.AppKey[Any]) -> Any:
    """`POST /prefix/receive {id, expected_wire_bytes[, request]}` on a decode worker: register
    the pull with the KV receiver, answer `{"expecting": true}`, wait for the prefix's KV, check
    its size and checksums, then free it (the pool keeps the prefix). NDJSON: the last line is
    the result, `{"kv_wire_bytes": n, "kv_verified": true}` or `{"error": ...}`."""

    async def handler(request: web.Request) -> web.StreamResponse:
        state: PrefixSink = request.app[key]
        body = await json_body(request)
        rid = str_field(body, "id", 64)
        expected = int_field(body, "expected_wire_bytes", 0, 1 << 50)
        label = label_field(body)
        timeout = state.spec.kv_timeout_s
        expect_kv(state.receiver, rid, total_bytes=expected, timeout_s=timeout, label=label)
        resp = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})

        async def result(doc: dict[str, Any]) -> web.StreamResponse:
            await resp.write((json.dumps(doc, separators=(",", ":")) + "\n").encode())
            return resp

        try:
            await resp.prepare(request)
            await resp.write(EXPECTING)
            manifest = await state.receiver.wait(rid, timeout)
        except TransferError as exc:
            return await result({"error": f"prefix transfer: {exc.reason}"})
        except TimeoutError:
            return await result({"error": "prefix transfer timed out"})
        finally:
            state.receiver.discard(rid)
        if manifest.total_bytes != expected:
            return await result(
                {"error": f"prefix size mismatch: got {manifest.total_bytes}, want {expected}"}
            )
        if not manifest.verified:
            return await result({"error": "prefix not verified"})
        return await result({"kv_wire_bytes": manifest.total_bytes, "kv_verified": True})

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
                if resp.status != 200:
                    doc["status"] = resp.status
                return doc
    except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
        return {"error": f"{url} unreachable ({type(exc).__name__})"}


async def _receive(
    session: aiohttp.ClientSession,
    url: str,
    body: dict[str, Any],
    timeout: float,
    registered: asyncio.Event,
) -> dict[str, Any]:
    """`POST /prefix/receive`: set `registered` at its first line, return its last one."""
    try:
        async with asyncio.timeout(timeout), session.post(url, json=body) as resp:
            if resp.status != 200:
                doc: dict[str, Any] = await resp.json(content_type=None)
                return {"error": f"HTTP {resp.status}: {doc.get('error', '')}"}
            async for line in resp.content:
                if not line.strip():
                    continue
                doc = json.loads(line)
                if doc.get("expecting"):
                    registered.set()
                    continue
                return doc
            return {"error": f"{url}: stream ended without a result"}
    except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
        return {"error": f"{url} unreachable ({type(exc).__name__})"}


async def pull_prefix(
    session: aiohttp.ClientSession,
    *,
    source: InstanceInfo,
    target: InstanceInfo,
    tokens: int,
    model: str,
    byte_scale: float,
    clock: Clock,
    timeout_s: float,
    label: str | None = None,
    kv_targets: list[tuple[str, int]] | None = None,
) -> PullResult:
    """Move `tokens` of cached prefix from `source` (a PrfaaS prefill instance) through the link
    proxy to `target` (a local decode instance); bounded by `timeout_s` wall seconds. The
    instances' URLs are the router's: a switchable PD instance's points at its decode role.

    The pull gets a fresh wire id; `target` registers it before `source` is asked to send.
    `label` (the request's client-visible id) names it in the decode's logs; `kv_targets`, the
    deployment's KV receivers, are handed to a source that does not know them yet (a 428)."""
    if target.kv_link_host is None or target.kv_link_port is None:
        return PullResult(False, 0, 0.0, f"failed: {target.id} has no link address")
    expected = sum(wire_layer_bytes(MODELS[model], tokens, byte_scale))
    wire_id = new_wire_id()
    start = clock.now()

    def seconds() -> float:
        return clock.now() - start

    registered = asyncio.Event()
    body: dict[str, Any] = {"id": wire_id, "expected_wire_bytes": expected}
    if label is not None:
        body["request"] = label
    receive = asyncio.create_task(
        _receive(session, f"{target.url}/prefix/receive", body, timeout_s, registered)
    )
    if not await _registered(receive, registered):
        receive.cancel()
        got = (await asyncio.gather(receive, return_exceptions=True))[0]
        why = got.get("error") if isinstance(got, dict) else None
        await _delete(session, f"{target.url}/decode/{wire_id}")
        reason = why or f"{target.id} did not register the pull within {REGISTER_TIMEOUT_S:g}s"
        return PullResult(False, 0, seconds(), f"failed: {reason}")
    send = {
        "id": wire_id,
        "tokens": tokens,
        "kv_host": target.kv_link_host,
        "kv_port": target.kv_link_port,
    }
    sent_doc = await _post(session, f"{source.url}/prefix/send", send, timeout_s)
    unset = sent_doc.get("status") == NO_TARGETS_STATUS
    if unset and kv_targets and await post_targets(session, source.url, kv_targets):
        sent_doc = await _post(session, f"{source.url}/prefix/send", send, timeout_s)
    sent = int(sent_doc.get("kv_wire_bytes_sent", 0))
    if "error" in sent_doc:
        receive.cancel()
        await asyncio.gather(receive, return_exceptions=True)
        await _delete(session, f"{target.url}/decode/{wire_id}")
        return PullResult(False, sent, seconds(), f"failed: {sent_doc['error']}")
    got = await receive
    if "error" in got:
        return PullResult(False, sent, seconds(), f"failed: {got['error']}")
    return PullResult(True, sent, seconds(), "ok")


async def _registered(receive: asyncio.Task[dict[str, Any]], registered: asyncio.Event) -> bool:
    """Wait (bounded) until the receiver registered the pull or its call ended."""
    flag = asyncio.create_task(registered.wait())
    try:
        await asyncio.wait(
            {receive, flag}, timeout=REGISTER_TIMEOUT_S, return_when=asyncio.FIRST_COMPLETED
        )
    finally:
        flag.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await flag
    return registered.is_set()


async def _delete(session: aiohttp.ClientSession, url: str) -> None:
    """Free what a decode receiver holds of an abandoned pull (best effort)."""
    try:
        async with asyncio.timeout(5):
            async with session.delete(url):
                pass
    except (aiohttp.ClientError, TimeoutError):
        pass
