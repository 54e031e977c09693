"""The prefill half of the `sglang` flavour, and its bootstrap route, where the two halves of one
gateway request meet by room.

The gateway sends the same request to a prefill and a decode worker at once, with
`bootstrap_room` (a random 63-bit integer) and the prefill's bootstrap address. The prefill half
queues the prompt at once (services.prefilling: the FIFO our router's prefills use); its
transfer waits until the room's decode has registered, then sends the KV layer by layer (the
layers computed meanwhile are queued, none is lost). The decode half registers with `POST
/bootstrap/{room}`: its instance id, the wire id its receiver expects and the KV size; the
prefill sends to that instance's direct KV port, or through the link when the clusters differ
(kv_targets.kv_address, our router's rule, from the deployment's table in
ServiceSpec.facade_decodes; checked against the KV targets as every send is). The registration
is a long poll: it is answered when the room's prefill has ended, with its outcome (times, bytes
sent, or the error), so a decode half learns at once that its KV will never come, and a prefill
that dies breaks the connection, which tells it the same.

The prefill half answers the gateway when the KV is acknowledged (an empty completion), or a
503 with the reason when it failed: the gateway retries a 503 with a new room.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field
from typing import Any, Final

from aiohttp import web

from testbed.services.facade.info import add_info_routes
from testbed.services.facade.journal import AttemptJournal, attempts_handler
from testbed.services.facade.openai import (
    FacadeRequest,
    completion_doc,
    openai_error,
    parse_request,
    sse,
    unavailable,
)
from testbed.services.facade.text import check_engine, codec
from testbed.services.kv_expect import EXPECT_GRACE_S, REGISTER_TIMEOUT_S
from testbed.services.kv_targets import kv_address
from testbed.services.prefilling import PrefillJob, PrefillState
from testbed.services.spec import InstanceInfo
from testbed.services.validate import int_field, json_body, str_field

__all__ = ["FACADE", "MAX_ROOMS", "PrefillFacade", "Registration", "Rooms", "add_prefill_routes"]

MAX_ROOMS: Final = 65536
"""Rooms a prefill half tracks at once (a room lives from its first half until its outcome is
read, or its deadline)."""

_TIMES = ("prefill_start", "prefill_end", "transfer_start", "transfer_end")


@dataclass(frozen=True)
class Registration:
    """A room's decode: where its KV goes and under which wire id."""

    wire_id: str
    decode: str
    address: tuple[str, int]
    expected: int


@dataclass
class Room:
    number: int
    deadline: float
    target: asyncio.Future[Registration]
    outcome: asyncio.Future[dict[str, Any]]
    """The prefill's end: its times and bytes, or `error`."""


@dataclass
class Rooms:
    """The rooms a prefill half knows, bounded in number and in time."""

    ttl_s: float
    rooms: dict[int, Room] = field(default_factory=dict)

    def get(self, number: int) -> Room:
        """The room, created by whichever half comes first; a 503 when too many are open."""
        now = time.monotonic()
        for n in [n for n, r in self.rooms.items() if r.deadline < now]:
            self.drop(n)
        room = self.rooms.get(number)
        if room is None:
            if len(self.rooms) >= MAX_ROOMS:
                raise openai_error("too many bootstrap rooms open", web.HTTPServiceUnavailable)
            loop = asyncio.get_running_loop()
            room = Room(number, now + self.ttl_s, loop.create_future(), loop.create_future())
            self.rooms[number] = room
        return room

    def drop(self, number: int) -> None:
        room = self.rooms.pop(number, None)
        if room is not None:
            for fut in (room.target, room.outcome):
                if not fut.done():
                    fut.cancel()


@dataclass
class PrefillFacade:
    state: PrefillState
    rooms: Rooms
    decodes: dict[str, InstanceInfo]
    journal: AttemptJournal = field(default_factory=AttemptJournal)


FACADE = web.AppKey("facade", PrefillFacade)


def _settle(room: Room, outcome: dict[str, Any]) -> None:
    if not room.outcome.done():
        room.outcome.set_result(outcome)


async def _prefill_half(request: web.Request, chat: bool) -> web.StreamResponse:
    fac = request.app[FACADE]
    state = fac.state
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
    job.queued_at = arrival = state.clock.now()
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
        _settle(room, {"error": reason})
        fac.journal.add("released", **entry, reason=reason)
        raise
    times = {k: result[k] for k in _TIMES if k in result}
    sent = int(result.get("kv_wire_bytes_sent", 0))
    outcome = {"prefill_instance": state.spec.id, "cluster": state.spec.cluster, **times,
               "kv_wire_bytes_sent": sent}  # fmt: skip
    if "error" in result:
        reason = f"prefill on {state.spec.id}: {result['error']}"
        _settle(room, {**outcome, "error": reason})
        fac.journal.add("failed", **entry, **times, kv_wire_bytes_sent=sent, reason=reason)
        return unavailable(reason)
    state.prompt_tokens += state.job_tokens(job)
    _settle(room, {**outcome, "ok": True})
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


async def _bootstrap(request: web.Request) -> web.Response:
    """`POST /bootstrap/{room}`: a decode half registers; answered with the room's outcome."""
    fac = request.app[FACADE]
    state = fac.state
    try:
        number = int(request.match_info["room"])
    except ValueError:
        raise openai_error("the room must be an integer") from None
    body = await json_body(request)
    wire_id = str_field(body, "wire_id", 64)
    decode = fac.decodes.get(str_field(body, "decode", 64))
    expected = int_field(body, "expected_wire_bytes", 0, 1 << 50)
    if decode is None:
        raise openai_error("not a decode instance of this deployment", web.HTTPForbidden)
    address = kv_address(state.spec.cluster, decode)
    if address is None:
        raise openai_error(f"decode instance {decode.id} has no KV address", web.HTTPConflict)
    state.targets.check(address)  # the deployment's KV receivers only, as for POST /prefill
    room = fac.rooms.get(number)
    if room.target.done():
        raise openai_error(f"bootstrap room {number} already has a decode", web.HTTPConflict)
    room.target.set_result(Registration(wire_id, decode.id, address, expected))
    try:
        outcome = await asyncio.wait_for(asyncio.shield(room.outcome), fac.rooms.ttl_s)
    except TimeoutError:
        outcome = {"error": f"no prefill for bootstrap room {number} on {state.spec.id}"}
    except asyncio.CancelledError:
        if not room.outcome.cancelled():
            raise
        outcome = {"error": f"bootstrap room {number} expired on {state.spec.id}"}
    finally:
        with contextlib.suppress(KeyError):
            if room.outcome.done():
                fac.rooms.rooms.pop(number)
    return web.json_response(outcome)


def add_prefill_routes(app: web.Application, state: PrefillState) -> PrefillFacade:
    """The `sglang` flavour's routes on a prefill worker's app."""
    spec = state.spec
    check_engine(spec)
    fac = PrefillFacade(
        state,
        Rooms(spec.kv_timeout_s + EXPECT_GRACE_S),
        {d.id: d for d in spec.facade_decodes},
    )
    app[FACADE] = fac
    codec()  # load the tokenizer now, not on the first request

    async def completions(request: web.Request) -> web.StreamResponse:
        return await _prefill_half(request, False)

    async def chat(request: web.Request) -> web.StreamResponse:
        return await _prefill_half(request, True)

    def load() -> tuple[int, int, int]:
        return (1 if state.running else 0), state.queue.qsize(), state.queued_tokens

    app.router.add_post("/v1/completions", completions)
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_post("/bootstrap/{room}", _bootstrap)
    app.router.add_get("/facade/attempts", attempts_handler(fac.journal))
    add_info_routes(app, mode="prefill", model=spec.model, load=load)
    return fac
