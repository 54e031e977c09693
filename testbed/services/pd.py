"""A local PD instance that the long-term loop can move between the prefill and decode roles.

One process holds both a prefill worker (mounted at `/prefill-role`) and a decode worker
(mounted at `/decode-role`, with its KV receiver), both services/prefill.py and decode.py on the
spec's engine, but serves only its active role: work sent to
the other one is refused with 409. `POST /role {"role": ...}` switches it, the equivalent of
restarting the engine in the other role with its weights still in memory:

- the switch is refused (409, "busy") until the active role has drained: no queued or running
  prefill and no KV transfer left, or no decode waiting for KV or in the batch. The router stops
  routing to an instance before it asks, so draining is its job; the check here makes sure a
  racing request is never dropped by a switch;
- the switch takes `role_switch_s` real-world seconds (ServiceSpec), during which neither role
  serves: what an engine restart costs (re-allocating KV memory, warming up).

Keeping one process per instance (instead of killing it and starting another) keeps its HTTP and
KV ports, so the link proxy in front of its KV port and the router's address for it stay valid.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Literal

from aiohttp import web

from testbed.clock import LiveClock
from testbed.services import decode as decode_svc
from testbed.services import prefill as prefill_svc
from testbed.services.spec import ServiceSpec
from testbed.services.validate import Handler, health, json_body, json_errors

__all__ = ["DECODE_PREFIX", "PREFILL_PREFIX", "create_app"]

PREFILL_PREFIX = "/prefill-role"
DECODE_PREFIX = "/decode-role"
Role = Literal["prefill", "decode"]


class RoleState:
    def __init__(
        self,
        spec: ServiceSpec,
        prefill: prefill_svc.PrefillState,
        decode: decode_svc.DecodeState,
    ) -> None:
        self.spec = spec
        self.clock = LiveClock.of(spec)
        self.active: Role | None = "decode" if spec.initial_role == "decode" else "prefill"
        self.prefill = prefill
        self.decode = decode
        self.switches = 0
        self.lock = asyncio.Lock()

    def busy(self) -> str | None:
        """Why the active role has not drained yet, or None."""
        if self.active == "prefill":
            p = self.prefill
            if p.queue.qsize() or p.running is not None or p.transfers:
                return (
                    f"prefill busy: {p.queue.qsize()} queued, running={p.running is not None}, "
                    f"{len(p.transfers)} transfers"
                )
        elif self.active == "decode":
            d = self.decode
            active, waiting = d.engine.active(), d.engine.waiting()
            if d.waiting_kv or active or waiting:
                return (
                    f"decode busy: {d.waiting_kv} waiting for KV, {active} active, "
                    f"{waiting} waiting"
                )
        return None


STATE = web.AppKey("role_state", RoleState)


def _conflict(message: str) -> web.HTTPConflict:
    return web.HTTPConflict(text=json.dumps({"error": message}), content_type="application/json")


@web.middleware
async def role_gate(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Refuse work for the role this instance is not serving (reads and /health pass)."""
    if request.method in ("POST", "DELETE"):
        state = request.app[STATE]
        for prefix, role in ((PREFILL_PREFIX, "prefill"), (DECODE_PREFIX, "decode")):
            cancel = role == "decode" and request.method == "DELETE"  # cancels always pass
            if request.path.startswith(prefix + "/") and state.active != role and not cancel:
                raise _conflict(f"instance {state.spec.id} is not serving {role}")
    return await handler(request)


async def _get_role(request: web.Request) -> web.Response:
    state = request.app[STATE]
    return web.json_response({"role": state.active, "switches": state.switches})


async def _set_role(request: web.Request) -> web.Response:
    state = request.app[STATE]
    body = await json_body(request)
    role = body.get("role")
    if role not in ("prefill", "decode"):
        raise web.HTTPBadRequest(
            text=json.dumps({"error": "role must be 'prefill' or 'decode'"}),
            content_type="application/json",
        )
    async with state.lock:
        if state.active == role:
            return web.json_response({"role": role, "switched": False})
        why = state.busy()
        if why is not None:
            raise _conflict(why)
        old, state.active = state.active, None
        started = state.clock.now()
        wall = time.monotonic()
        await state.clock.sleep(state.spec.role_switch_s)
        state.active = role
        state.switches += 1
    return web.json_response(
        {
            "role": role,
            "from": old,
            "switched": True,
            "started": started,
            "ready": state.clock.now(),
            "wall_s": time.monotonic() - wall,
        }
    )


async def _stats(request: web.Request) -> web.Response:
    """Both roles' engine timing (`prefill_engine`, `decode_engine`); `engine`, which the report
    lists per instance, is the one of the role that ran more steps."""
    state = request.app[STATE]
    p = state.prefill.engine.stats()
    d = state.decode.engine.stats()
    engine = p if p.get("steps", 0) >= d.get("steps", 0) else d
    return web.json_response(
        {
            "id": state.spec.id,
            "role": state.active,
            "switches": state.switches,
            "engine": engine,
            "prefill_engine": p,
            "decode_engine": d,
        }
    )


async def create_app(spec: ServiceSpec) -> tuple[web.Application, dict[str, int]]:
    papp, _ = await prefill_svc.create_app(spec.model_copy(update={"role": "prefill"}))
    dapp, ports = await decode_svc.create_app(spec.model_copy(update={"role": "decode"}))
    app = web.Application(client_max_size=1 << 20, middlewares=[json_errors, role_gate])
    app[STATE] = RoleState(spec, papp[prefill_svc.STATE], dapp[decode_svc.STATE])
    app.router.add_get("/role", _get_role)
    app.router.add_post("/role", _set_role)
    app.router.add_get("/stats", _stats)
    app.router.add_get("/health", health)
    app.add_subapp(PREFILL_PREFIX, papp)
    app.add_subapp(DECODE_PREFIX, dapp)
    return app, ports
