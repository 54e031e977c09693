"""The prefill half of the `sglang` flavour.

The gateway sends the same request to a prefill and a decode worker at once, with
`bootstrap_room` (a random 63-bit integer) and the prefill's bootstrap address. The prefill half
queues the prompt at once (services.prefilling: the FIFO our router's prefills use); its
transfer waits until the room's decode has registered with the bootstrap route (facade.rooms),
then sends the KV layer by layer (the layers computed meanwhile are queued, none is lost), so
the transfer overlaps the prefill as our own router's does.

The prefill half answers the gateway when the KV is acknowledged (an empty completion), or a
503 with the reason when it failed: the gateway retries a 503 with a new room.
"""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp import web

from testbed.services.facade.openai import (
    FacadeRequest,
    completion_doc,
    openai_error,
    parse_request,
    sse,
    unavailable,
)
from testbed.services.facade.rooms import FACADE, settle
from testbed.services.kv_expect import REGISTER_TIMEOUT_S
from testbed.services.prefilling import PrefillJob
from testbed.services.validate import json_body

__all__ = ["TIMES", "prefill_half"]

TIMES = ("prefill_start", "prefill_end", "transfer_start", "transfer_end")
"""A prefill job's times an attempt reports (for the record)."""


async def prefill_half(request: web.Request, chat: bool) -> web.StreamResponse:
    """`POST /v1/completions` (or chat) on a prefill worker: queue at once, answer when the KV
    is acknowledged."""
    fac = request.app[FACADE]
    state = fac.state
    arrival = state.clock.now()  # before sizing the prompt (the job queues after it)
    body = await json_body(request, error=openai_error)
    req = await parse_request(body, chat=chat, max_output_tokens=1 << 30, model=state.spec.model)
    room = fac.rooms.get(req.room)
    work = state.engine.parse({"uncached_tokens": req.input_tokens})

    async def resolve(job: PrefillJob) -> None:
        try:
            reg = await asyncio.wait_for(asyncio.shield(room.target), REGISTER_TIMEOUT_S)
        except TimeoutError:
            raise RuntimeError(
                f"no decode registered for bootstrap room {req.room} within {REGISTER_TIMEOUT_S:g}s"
            ) from None
        job.id, job.target = reg.wire_id, reg.address

    loop = asyncio.get_running_loop()
    job = PrefillJob(f"room-{req.room}", work, ("", 0), loop.create_future(), resolve=resolve)
    job.queued_at = state.clock.now()
    entry: dict[str, Any] = {
        "side": "prefill",
        "instance": state.spec.id,
        "cluster": state.spec.cluster,
        "room": req.room,
        "request": req.label,
        "input_tokens": req.input_tokens,
        "arrival": arrival,
    }
    try:
        result = await state.run_job(job)
    except asyncio.CancelledError:  # the gateway closed the request
        reason = "prefill: the router closed the request"
        settle(room, {"error": reason})
        fac.journal.add("released", **entry, reason=reason)
        raise
    times = {k: result[k] for k in TIMES if k in result}
    sent = int(result.get("kv_wire_bytes_sent", 0))
    outcome = {"prefill_instance": state.spec.id, "cluster": state.spec.cluster, **times,
               "kv_wire_bytes_sent": sent}  # fmt: skip
    if "error" in result:
        reason = f"prefill on {state.spec.id}: {result['error']}"
        settle(room, {**outcome, "error": reason})
        fac.journal.add("failed", **entry, **times, kv_wire_bytes_sent=sent, reason=reason)
        return unavailable(reason)
    state.prompt_tokens += state.job_tokens(job)
    settle(room, {**outcome, "ok": True})
    fac.journal.add("completed", **entry, **times, kv_wire_bytes_sent=sent)
    return await _answer(request, req)


async def _answer(request: web.Request, req: FacadeRequest) -> web.StreamResponse:
    """The prefill's answer: an empty completion (the gateway streams the decode's)."""
    cid = f"{'chatcmpl' if req.chat else 'cmpl'}-room-{req.room}"
    if not req.stream:
        return web.json_response(completion_doc(req, cid, "", "length", usage=0))
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    await resp.write(sse(completion_doc(req, cid, "", "length", first=True)) + b"data: [DONE]\n\n")
    return resp
