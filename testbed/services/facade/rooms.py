"""Rooms, and the bootstrap route where the two halves of one router request meet.

A room is one request's handoff on a prefill worker: the decode half registers with `POST
/bootstrap/{room}` (its instance id, the wire id its receiver expects and the KV size), which
resolves where the prefill sends the KV: that instance's direct KV port, or through the link when
the clusters differ (kv_targets.kv_address, our router's rule, from the deployment's table in
ServiceSpec.facade_decodes; checked against the KV targets as every send is). The registration
is a long poll: it is answered when the room's prefill (and its transfer) has ended, with its
outcome (times, bytes sent, or the error), so a decode half learns at once that its KV will
never come, and a prefill that dies breaks the connection, which tells it the same.

Both flavours meet here. `sglang`: the room is the gateway's `bootstrap_room`, made by whichever
half comes first (facade.sglang_prefill). `vllm`: the room is the KV handle the prefill half made
and answered in `kv_transfer_params.remote_block_ids` (facade.vllm_prefill); a registration for
a handle the prefill does not hold (never made, or released) is a 404 at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import secrets
import time
from dataclasses import dataclass, field
from typing import Any, Final

from aiohttp import web

from testbed.services.facade.journal import AttemptJournal
from testbed.services.facade.openai import openai_error
from testbed.services.kv_targets import kv_address
from testbed.services.prefilling import PrefillState
from testbed.services.spec import InstanceInfo
from testbed.services.validate import int_field, json_body, str_field

__all__ = [
    "FACADE",
    "MAX_ROOMS",
    "PrefillFacade",
    "Registration",
    "Room",
    "Rooms",
    "bootstrap",
    "settle",
]

MAX_ROOMS: Final = 65536
"""Rooms a prefill half tracks at once (a room lives from its first half until its outcome is
read, or its deadline)."""


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
    """time.monotonic() past which the room is dropped (math.inf: not yet)."""
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

    def open(self) -> Room:
        """A new room under a fresh unguessable number, kept until `deadline` is set (the
        `vllm` flavour's KV handle: the prefill half sets it once the KV is held)."""
        number = secrets.randbits(63)  # as SGLang's rooms: JSON-safe for any router
        while number in self.rooms:
            number = secrets.randbits(63)
        room = self.get(number)
        room.deadline = math.inf
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
    opens_rooms: bool = True
    """A registration may open its room (`sglang`: either half may come first); False
    (`vllm`): only the prefill half makes one, a registration for another is a 404."""
    journal: AttemptJournal = field(default_factory=AttemptJournal)


FACADE = web.AppKey("facade", PrefillFacade)


def settle(room: Room, outcome: dict[str, Any]) -> None:
    """The room's prefill has ended: answer its registration (once)."""
    if not room.outcome.done():
        room.outcome.set_result(outcome)


async def bootstrap(request: web.Request) -> web.Response:
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
    engine = body.get("engine")
    if decode is None:
        raise openai_error("not a decode instance of this deployment", web.HTTPForbidden)
    if engine is not None and engine != state.spec.id:
        raise openai_error(f"this is {state.spec.id}, not engine {engine}", web.HTTPConflict)
    address = kv_address(state.spec.cluster, decode)
    if address is None:
        raise openai_error(f"decode instance {decode.id} has no KV address", web.HTTPConflict)
    state.targets.check(address)  # the deployment's KV receivers only, as for POST /prefill
    room = fac.rooms.get(number) if fac.opens_rooms else fac.rooms.rooms.get(number)
    if room is None:
        raise openai_error(
            f"{state.spec.id} holds no KV under handle {number} (never made, or released)",
            web.HTTPNotFound,
        )
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
