"""The decode half of both flavours.

It sizes the prompt (`input_tokens`, or the shipped tokenizer), registers the KV with its
receiver under a fresh wire id (the capability only it and the room's prefill learn:
transfer/capability.py), tells the prefill's bootstrap route who it is (facade.rooms), and waits
for the KV with the instance's KV timeout, then verifies it: the steps our own router's
`POST /decode` runs (services.decoding). Where it finds the prefill and the room is the
flavour's (facade.openai.Meeting): SGLang's `bootstrap_*` fields, sent to both halves at once,
or vllm-router's copy of the prefill's `kv_transfer_params` (the prefill's address and KV
handle: a pull of KV the prefill already holds, facade.vllm_prefill). It **holds its status
line until the KV is verified**: SGLang's gateway waits for both halves' response heads and
vllm-router passes the decode's status on, so a KV that never comes must be a 503 the router
sees (and may retry), not a failure inside a 200 stream. Then it decodes and streams in
OpenAI's shape.

Every attempt ends in the journal (facade.journal): completed, failed (a 503, with the reason),
or released: the gateway closed the request (a client that went away, or the gateway giving up
on this attempt); the receiver's entry is freed either way, so no orphan half holds KV memory or
a batch slot past its request.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp import web

from testbed.engine.emulated import wire_layer_bytes
from testbed.profiles import MODELS
from testbed.services.decoding import (
    DecodeFailed,
    DecodeState,
    KVArrival,
    decode_tokens,
    receive_kv,
)
from testbed.services.facade.journal import AttemptJournal
from testbed.services.facade.openai import (
    FacadeRequest,
    MeetingReader,
    completion_doc,
    openai_error,
    parse_request,
    sse,
    unavailable,
)
from testbed.services.facade.text import codec
from testbed.services.kv_expect import EXPECT_GRACE_S, REGISTER_TIMEOUT_S, expect_kv
from testbed.services.validate import json_body
from testbed.transfer.capability import new_wire_id

__all__ = ["FACADE", "OUTCOME_WAIT_S", "DecodeFacade", "decode_half"]

OUTCOME_WAIT_S = 5.0
"""Wall seconds the decode half waits, once its KV is in, for the prefill's outcome (its times
for the record): the prefill answers as soon as the KV is acknowledged."""

_PREFILL = ("prefill_instance", "prefill_start", "prefill_end", "transfer_start", "transfer_end")


@dataclass
class DecodeFacade:
    state: DecodeState
    session: aiohttp.ClientSession
    meeting: MeetingReader
    """Where the flavour's requests say the prefill and the room are."""
    journal: AttemptJournal = field(default_factory=AttemptJournal)


FACADE = web.AppKey("facade", DecodeFacade)


def _message(doc: Any) -> str:
    err = doc.get("error") if isinstance(doc, dict) else None
    if isinstance(err, dict):
        err = err.get("message")
    return str(err) if err is not None else str(doc)[:200]


async def _register(
    fac: DecodeFacade, req: FacadeRequest, wire_id: str, expected: int
) -> dict[str, Any]:
    """Register with the room's prefill; its outcome when the prefill ends (`error` if it
    failed, could not be reached, or broke the connection: it died)."""
    spec = fac.state.spec
    where = f"{req.bootstrap_host}:{req.bootstrap_port}"
    url = f"http://{where}/bootstrap/{req.room}"
    body: dict[str, Any] = {"wire_id": wire_id, "decode": spec.id, "expected_wire_bytes": expected}
    if req.engine is not None:  # vllm: the prefill checks it is the engine the handle names
        body["engine"] = req.engine
    timeout = aiohttp.ClientTimeout(
        total=spec.kv_timeout_s + EXPECT_GRACE_S + REGISTER_TIMEOUT_S,
        sock_connect=REGISTER_TIMEOUT_S,
    )
    try:
        async with fac.session.post(url, json=body, timeout=timeout) as resp:
            doc = await resp.json(content_type=None)
            if resp.status != 200 or not isinstance(doc, dict):
                return {"error": f"prefill bootstrap at {where}: HTTP {resp.status}: "
                                 f"{_message(doc)}"}  # fmt: skip
            return doc
    except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
        return {"error": f"prefill bootstrap at {where} failed: {type(exc).__name__}: {exc}"}


async def decode_half(request: web.Request, chat: bool) -> web.StreamResponse:
    """`POST /v1/completions` (or chat) on a decode worker (see the module's doc)."""
    fac = request.app[FACADE]
    state = fac.state
    spec = state.spec
    arrival = state.clock.now()  # before sizing the prompt, which a text prompt makes costly
    body = await json_body(request, error=openai_error)
    req = await parse_request(
        body,
        chat=chat,
        max_output_tokens=state.engine.max_output_tokens,
        model=spec.model,
        meeting=fac.meeting,
    )
    wire_id = new_wire_id()
    expected = sum(wire_layer_bytes(MODELS[spec.model], req.input_tokens, spec.byte_scale))
    expect_kv(state.receiver, wire_id, total_bytes=expected, timeout_s=spec.kv_timeout_s,
              label=req.label)  # fmt: skip
    entry: dict[str, Any] = {
        "side": "decode",
        "instance": spec.id,
        "cluster": spec.cluster,
        "room": req.room,
        "request": req.label,
        "input_tokens": req.input_tokens,
        "output_tokens": req.output_tokens,
        "arrival": arrival,
        "kv_wire_bytes_expected": expected,
        "prefill_addr": f"{req.bootstrap_host}:{req.bootstrap_port}",  # where the router paired
    }
    if (rid := request.headers.get("X-Request-Id")) is not None:  # vllm-router's own id
        entry["router_id"] = rid[:160]
    boot = asyncio.ensure_future(_register(fac, req, wire_id, expected))

    async def gone() -> str:
        outcome = await asyncio.shield(boot)
        if "error" in outcome:
            return str(outcome["error"])
        await asyncio.Event().wait()  # acknowledged: the receiver's wait ends first
        raise AssertionError("unreachable")

    try:
        kv = await receive_kv(state, wire_id, expected, gone=gone())
    except DecodeFailed as exc:
        state.failed += 1
        boot.cancel()
        reason = f"decode on {spec.id}: {exc.reason}"
        fac.journal.add("failed", **entry, reason=reason)
        return unavailable(reason)
    except asyncio.CancelledError:
        boot.cancel()
        reason = "the router closed the request before its KV came"
        fac.journal.add("released", **entry, reason=reason)
        raise
    try:
        outcome = await asyncio.wait_for(asyncio.shield(boot), OUTCOME_WAIT_S)
    except TimeoutError:
        boot.cancel()
        outcome = {}
    entry.update({k: outcome[k] for k in _PREFILL if k in outcome})
    entry["kv_wire_bytes_sent"] = int(outcome.get("kv_wire_bytes_sent", 0))
    entry["route"] = outcome.get("cluster")
    entry["kv_wire_bytes_received"] = kv.manifest.total_bytes
    return await _stream(request, fac, req, entry, kv, wire_id)


async def _stream(
    request: web.Request,
    fac: DecodeFacade,
    req: FacadeRequest,
    entry: dict[str, Any],
    kv: KVArrival,
    wire_id: str,
) -> web.StreamResponse:
    """Decode and answer: the status line goes out only now, the KV verified."""
    state = fac.state
    cid = f"{'chatcmpl' if req.chat else 'cmpl'}-{req.label or req.room}"
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    sent = 0

    async def send(line: dict[str, Any]) -> None:
        nonlocal sent
        if line.get("admitted"):
            entry["kv_verified"] = bool(line.get("kv_verified"))
            if entry["kv_verified"]:  # before the status line: a worker dying later keeps it
                fac.journal.progress(**entry)
            if req.stream:
                await resp.prepare(request)
        elif "tokens" in line:
            n = int(line["tokens"])
            if req.stream:
                text = codec().filler_text(sent, n)
                await resp.write(sse(completion_doc(req, cid, text, first=sent == 0)))
            sent += n
            entry["tokens_out"] = sent

    try:
        final = await decode_tokens(state, wire_id, req.output_tokens, kv, send)
    except DecodeFailed as exc:
        state.failed += 1
        reason = f"decode on {state.spec.id}: {exc.reason}"
        fac.journal.add("failed", **entry, reason=reason)
        if not resp.prepared:
            return unavailable(reason)
        err = {"error": {"message": reason, "type": "server_error"}}
        with contextlib.suppress(ConnectionError, aiohttp.ClientConnectionResetError):
            await resp.write(sse(err) + b"data: [DONE]\n\n")
        return resp
    except (asyncio.CancelledError, ConnectionError, aiohttp.ClientConnectionResetError):
        fac.journal.add("released", **entry, reason="the router closed the request mid-stream")
        raise
    entry.update(first_token=final["first_token"], last_token=final["last_token"],
                 kv_ready=final["kv_ready"], tokens_out=sent)  # fmt: skip
    fac.journal.add("completed", **entry)
    if not req.stream:
        return web.json_response(
            completion_doc(req, cid, codec().filler_text(0, sent), "length", usage=sent)
        )
    tail = sse(completion_doc(req, cid, "", "length"))
    if req.include_usage:
        tail += sse(completion_doc(req, cid, None, usage=sent))
    with contextlib.suppress(ConnectionError, aiohttp.ClientConnectionResetError):
        await resp.write(tail + b"data: [DONE]\n\n")
    return resp
