"""The HTTP form: `python -m least_ttft.server --port 9000` answers the decision protocol
`prfaas-policy/1` at POST /route (outcomes at POST /feedback) without importing the testbed,
so it also shows what a service in any other language has to do:

- keep one copy of the deployment per router (`router` in the request): a snapshot with
  `base: null` replaces it, a delta (`base` = the version held) patches it, and a delta on any
  other base is answered 409 so the router sends the whole snapshot;
- answer 200 with a route, or 503 when no instance can take the request yet.

`--delay 50ms` answers late on purpose: with the testbed's default 20 ms timeout every decision
then falls back, which is how docs/validate-your-scheduler.md shows the fallback.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import re
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from least_ttft.core import KnotCosts, choose

PROTOCOL = "prfaas-policy/1"
COLUMNS = ("id", "cluster", "role", "outstanding", "outstanding_work", "queue_wait_s", "state",
           "hardware")  # fmt: skip
MAX_ROUTERS = 64
"""Routers whose deployment copy is kept (least recently used dropped; it then resyncs)."""


@dataclass(frozen=True)
class Instance:
    id: str
    cluster: str
    role: str
    outstanding: int
    outstanding_work: float
    queue_wait_s: float
    state: str
    hardware: str | None


@dataclass(frozen=True)
class Request:
    id: str
    input_tokens: int
    output_tokens: int
    cached_local: int = 0
    cached_prfaas: int = 0
    kv_bytes: float = 0.0


@dataclass(frozen=True)
class Link:
    bandwidth_bps: float | None = None
    in_flight_bytes: float | None = None
    delivered_bps: float | None = None
    rtt_s: float | None = None
    scarce: bool = False


class Mirror:
    """One router's deployment, as its full and delta snapshots describe it."""

    def __init__(self) -> None:
        self.version: int | None = None
        self.instances: dict[str, Instance] = {}
        """Decoded once, when a row arrives: a delta costs what changed, not the deployment."""
        self.costs: KnotCosts | None = None

    def apply(self, snap: dict[str, Any]) -> bool:
        """False when `snap` is a delta on a version not held (answer 409)."""
        base = snap.get("base")
        if base is None:
            self.instances = {}
            c = snap.get("costs")
            if c:
                self.costs = KnotCosts(
                    {k: (v[0], v[1]) for k, v in c["prefill_knots"].items()},
                    (c["kv_knots"][0], c["kv_knots"][1]),
                    float(c.get("kv_state_bytes", 0.0)),
                )
        elif base != self.version:
            self.version = None
            return False
        for iid in snap.get("removed", ()):
            self.instances.pop(iid, None)
        for row in snap["instances"]:
            self.instances[row[0]] = Instance(*row)
        self.version = snap["version"]
        return True


class Service:
    def __init__(self, delay_s: float = 0.0) -> None:
        self.delay_s = delay_s
        self.mirrors: collections.OrderedDict[str, Mirror] = collections.OrderedDict()
        self.decisions = 0
        self.feedback: collections.Counter[str] = collections.Counter()

    def mirror(self, router: str) -> Mirror:
        m = self.mirrors.get(router)
        if m is None:
            m = self.mirrors[router] = Mirror()
            while len(self.mirrors) > MAX_ROUTERS:
                self.mirrors.popitem(last=False)
        self.mirrors.move_to_end(router)
        return m

    def decide(self, doc: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        """(HTTP status, body) for one decision document."""
        if doc.get("protocol") != PROTOCOL:
            return 400, {"error": f"expected protocol {PROTOCOL}"}
        snap = doc["snapshot"]
        mirror = self.mirror(str(doc.get("router", "")))
        if not mirror.apply(snap):
            return 409, {"protocol": PROTOCOL, "error": "resync"}
        instances = list(mirror.instances.values())
        link = Link(**snap["link"]) if snap.get("link") else None
        fields = Request.__dataclass_fields__
        req = Request(**{k: v for k, v in doc["request"].items() if k in fields})
        c = choose(req, instances, link, mirror.costs)
        self.decisions += 1
        if c is None:
            return 503, {"protocol": PROTOCOL, "error": "no usable instance"}
        return 200, {
            "protocol": PROTOCOL,
            "route": {
                "prefill_cluster": c.prefill.cluster,
                "prefill_instance": c.prefill.id,
                "decode_instance": c.decode.id,
                "uncached_tokens": c.uncached_tokens,
                "pull_prefix_tokens": 0,
            },
            "predicted_ttft_s": c.predicted_ttft_s,
        }

    async def route(self, request: web.Request) -> web.Response:
        try:
            doc = await request.json()
            if self.delay_s:
                await asyncio.sleep(self.delay_s)
            status, body = self.decide(doc)
        except (ValueError, KeyError, TypeError) as exc:
            status, body = 400, {"error": f"bad request: {type(exc).__name__}: {exc}"}
        return web.json_response(body, status=status)

    async def on_feedback(self, request: web.Request) -> web.Response:
        try:
            doc = await request.json()
            self.feedback[str(doc["outcome"]["status"])] += 1
        except (ValueError, KeyError, TypeError):
            return web.json_response({"error": "bad feedback"}, status=400)
        return web.json_response({"ok": True})

    async def stats(self, request: web.Request) -> web.Response:
        return web.json_response({"decisions": self.decisions, "feedback": dict(self.feedback)})


SERVICE = web.AppKey("service", Service)


def make_app(delay_s: float = 0.0) -> web.Application:
    service = Service(delay_s)
    app = web.Application()
    app[SERVICE] = service
    app.router.add_post("/route", service.route)
    app.router.add_post("/feedback", service.on_feedback)
    app.router.add_get("/stats", service.stats)
    return app


def _duration(text: str) -> float:
    m = re.fullmatch(r"\s*([0-9.]+)\s*(ms|s)\s*", text)
    if not m:
        raise argparse.ArgumentTypeError(f"{text!r}: write it like 50ms or 0.05s")
    return float(m[1]) / (1e3 if m[2] == "ms" else 1.0)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(
        prog="python -m least_ttft.server", description=__doc__.split("\n")[0]
    )
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=9000)
    ap.add_argument("--delay", type=_duration, default=0.0, help="answer late (e.g. 50ms)")
    args = ap.parse_args(argv)
    print(
        f"least-ttft: serving prfaas-policy/1 on http://{args.host}:{args.port}/route", flush=True
    )
    web.run_app(make_app(args.delay), host=args.host, port=args.port, access_log=None,
                print=None)  # fmt: skip


if __name__ == "__main__":
    main()
