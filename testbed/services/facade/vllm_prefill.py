"""The prefill half of the `vllm` flavour: prefill, hold the KV, hand its handle to the router.

vllm-router (its default NIXL connector) is sequential: it posts the client's request to a
prefill worker with `max_tokens: 1`, `min_tokens: 1`, `stream: false` and `kv_transfer_params:
{"do_remote_decode": true, ...}`, then copies the answer's `kv_transfer_params` into the
original request and posts that to a decode worker, which pulls the KV from the prefill
(tests/services/facade/fixtures/vllm-router-0.1.17). So this half queues the prompt in the
instance's FIFO (services.prefilling) and, once it is computed, answers one token with
`kv_transfer_params` naming itself: `remote_engine_id` (its instance id), `remote_host` and
`remote_port` (the address the router's call arrived at, its own listening socket: whatever
proxy the router went through, the decode reaches the instance itself) and `remote_block_ids`
(one number, the KV handle: a room, facade.rooms). `usage.prompt_tokens_details.cached_tokens`
is 0: the router-facing API has no prefix cache (vllm-router copies it into the decode's
answer).

The computed layers stay queued in the job's transfer, held under the handle, until the decode
half registers with the bootstrap route under it; the transfer then sends them to the decode's
KV port, or through the link when the clusters differ, as every send. So, unlike the `sglang`
flavour, **the KV transfer starts after the prefill ended**: no layer-wise overlap, as with
vLLM's NIXL pull. A handle no decode pulls within the instance's KV timeout is released (vLLM's
abort timeout, VLLM_NIXL_ABORT_REQUEST_TIMEOUT) and journaled as released, as is a prefill the
router closed before it ended; a prefill that fails is a 503 (vllm-router does not retry it: its
client gets a 500).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from aiohttp import web

from testbed.services.facade.openai import (
    FacadeRequest,
    completion_doc,
    openai_error,
    parse_request,
    sse,
    unavailable,
    vllm_prefill_meeting,
)
from testbed.services.facade.rooms import FACADE, PrefillFacade, Room, settle
from testbed.services.facade.sglang_prefill import TIMES
from testbed.services.facade.text import codec
from testbed.services.kv_expect import EXPECT_GRACE_S
from testbed.services.prefilling import PrefillJob
from testbed.services.validate import json_body

__all__ = ["prefill_half"]

_ROUTER_ID_CHARS = 160
"""Of the router's X-Request-Id kept in the journal (vllm-router's names both workers' addresses
and a uuid: `___prefill_addr_H:P___decode_addr_H:P_<uuid>`)."""


def _ended(
    fac: PrefillFacade, room: Room, entry: dict[str, Any], released: list[str]
) -> Callable[[asyncio.Future[dict[str, Any]]], None]:
    """The job's end (its result set): settle the room for the decode's registration, journal
    the attempt once, forget a handle nobody registered for."""

    def done(fut: asyncio.Future[dict[str, Any]]) -> None:
        spec = fac.state.spec
        result = {"error": "cancelled"} if fut.cancelled() else fut.result()
        times = {k: result[k] for k in TIMES if k in result}
        sent = int(result.get("kv_wire_bytes_sent", 0))
        outcome = {"prefill_instance": spec.id, "cluster": spec.cluster, **times,
                   "kv_wire_bytes_sent": sent}  # fmt: skip
        if "error" not in result:
            settle(room, {**outcome, "ok": True})
            fac.journal.add("completed", **entry, **times, kv_wire_bytes_sent=sent)
            return
        reason = released[0] if released else f"prefill on {spec.id}: {result['error']}"
        settle(room, {**outcome, "error": reason})
        fac.journal.add("released" if released else "failed", **entry, **times,
                        kv_wire_bytes_sent=sent, reason=reason)  # fmt: skip
        if not room.target.done():
            fac.rooms.drop(room.number)

    return done


async def prefill_half(request: web.Request, chat: bool) -> web.StreamResponse:
    """`POST /v1/completions` (or chat) on a prefill worker: answer once the KV is computed,
    hold it for the decode's pull (see the module's doc)."""
    fac = request.app[FACADE]
    state = fac.state
    spec = state.spec
    arrival = state.clock.now()  # before sizing the prompt (the job queues after it)
    body = await json_body(request, error=openai_error)
    req = await parse_request(body, chat=chat, max_output_tokens=1 << 30, model=spec.model,
                              meeting=vllm_prefill_meeting)  # fmt: skip
    room = fac.rooms.open()
    hold_s = spec.kv_timeout_s
    prefilled = asyncio.Event()
    released: list[str] = []

    async def resolve(job: PrefillJob) -> None:
        await prefilled.wait()  # the layers queue meanwhile: the KV is held, none is lost
        try:
            reg = await asyncio.wait_for(asyncio.shield(room.target), hold_s)
        except TimeoutError:
            released.append(f"prefill on {spec.id}: no decode pulled KV handle {room.number} "
                            f"within {hold_s:g}s: released")  # fmt: skip
            raise RuntimeError(released[0]) from None
        job.id, job.target = reg.wire_id, reg.address

    def held(_job: PrefillJob) -> None:
        room.deadline = time.monotonic() + hold_s + EXPECT_GRACE_S  # the hold's own bound first
        prefilled.set()

    loop = asyncio.get_running_loop()
    job = PrefillJob(f"handle-{room.number}", state.engine.parse({"uncached_tokens":
                     req.input_tokens}), ("", 0), loop.create_future(), resolve=resolve,
                     on_prefilled=held)  # fmt: skip
    job.queued_at = state.clock.now()
    entry: dict[str, Any] = {
        "side": "prefill",
        "instance": spec.id,
        "cluster": spec.cluster,
        "room": room.number,
        "request": req.label,
        "input_tokens": req.input_tokens,
        "arrival": arrival,
        "router_id": request.headers.get("X-Request-Id", "")[:_ROUTER_ID_CHARS] or None,
    }
    job.result.add_done_callback(_ended(fac, room, entry, released))
    state.submit(job)
    computed: asyncio.Future[Any] = asyncio.ensure_future(prefilled.wait())
    try:
        await asyncio.wait([computed, job.result], return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:  # the router closed the request before the KV was computed
        if not prefilled.is_set():
            released.append("prefill: the router closed the request")
            state.cancel(job, released[0])
        raise
    finally:
        computed.cancel()
    if not prefilled.is_set():  # failed before its KV was computed
        return unavailable(f"prefill on {spec.id}: {job.result.result().get('error')}")
    state.prompt_tokens += state.job_tokens(job)
    return await _answer(request, req, room.number)


def _own_address(request: web.Request) -> tuple[str, int]:
    """The instance's own listening address, as the router's connection reached it."""
    sock = request.transport.get_extra_info("sockname") if request.transport else None
    if isinstance(sock, tuple) and len(sock) >= 2:
        return str(sock[0]), int(sock[1])
    spec = request.app[FACADE].state.spec
    return spec.host, spec.port


async def _answer(request: web.Request, req: FacadeRequest, handle: int) -> web.StreamResponse:
    """One token, and the `kv_transfer_params` the router hands the decode."""
    spec = request.app[FACADE].state.spec
    host, port = _own_address(request)
    cid = f"{'chatcmpl' if req.chat else 'cmpl'}-handle-{handle}"
    doc = completion_doc(req, cid, codec().filler_text(0, 1), "length", usage=1, cached=0,
                         first=req.stream)  # fmt: skip
    doc["kv_transfer_params"] = {
        "do_remote_prefill": True,
        "do_remote_decode": False,
        "remote_engine_id": spec.id,
        "remote_block_ids": [handle],
        "remote_host": host,
        "remote_port": port,
        "tp_size": 1,
    }
    if not req.stream:  # what vllm-router asks (stream: false); a stream is answered in kind
        return web.json_response(doc)
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    await resp.write(sse(doc) + b"data: [DONE]\n\n")
    return resp
