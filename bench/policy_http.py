"""Decision overhead of the HTTP policy on loopback (issue #16, acceptance 4).

A router-side client (testbed.policy.http, through the shared Decider) asks a service in its
own process for N decisions on a deployment of `--instances` instances, where each decision
changes the load of two of them (the prefill and the decode it charges), as a router's do.
Services:
- `echo`: parses the decision, keeps the deployment copy (full + deltas, 409 on a lost base)
  and answers a fixed route: the protocol's own cost (JSON both ways, HTTP, loopback);
- `least-ttft`: the example scheduler (examples/least-ttft), which also scans every instance.
Clients: `sim` (blocking http.client, keep-alive) and `live` (one aiohttp session).
Prints p50/p99 wall milliseconds per decision and the request size, for delta snapshots and,
for comparison, full ones (`validate=0`, the hot path; no fallback may happen).

Usage: python bench/policy_http.py [--instances 1000] [--decisions 2000] [--report FILE]
(~30 s). `--report FILE` also writes the table, under its provenance header, as the
`policy_http` section of FILE (bench/reports/policy_http.md), the rest of FILE kept.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from provenance import reported  # bench/ is on sys.path

from testbed.policy.base import InstanceLoad, RequestView, Snapshot
from testbed.policy.decider import Decider
from testbed.policy.protocol import encode_decision
from testbed.scenario.external_router import free_port

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "least-ttft"

ECHO = r"""
import sys
from aiohttp import web
port = int(sys.argv[1])
mirrors = {}
async def route(request):
    doc = await request.json()
    snap = doc["snapshot"]
    m = mirrors.setdefault(doc["router"], {"version": None, "rows": {}})
    if snap["base"] is None:
        m["rows"] = {}
    elif snap["base"] != m["version"]:
        m["version"] = None
        return web.json_response({"error": "resync"}, status=409)
    for i in snap["removed"]:
        m["rows"].pop(i, None)
    for row in snap["instances"]:
        m["rows"][row[0]] = row
    m["version"] = snap["version"]
    return web.json_response({"protocol": "prfaas-policy/1", "route": {
        "prefill_cluster": "prfaas", "prefill_instance": "p0", "decode_instance": "d0",
        "uncached_tokens": doc["request"]["input_tokens"]}})
app = web.Application()
app.router.add_post("/route", route)
web.run_app(app, host="127.0.0.1", port=port, access_log=None, print=None)
"""


def start(service: str) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    if service == "echo":
        cmd = [sys.executable, "-c", ECHO, str(port)]
    else:
        cmd = [sys.executable, "-m", "least_ttft.server", "--port", str(port)]
    env = {**os.environ, "PYTHONPATH": f"{EXAMPLE}:{os.environ.get('PYTHONPATH', '')}"}
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL)
    for _ in range(200):
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.1):
                break
        except OSError:
            time.sleep(0.05)
    return proc, f"http://127.0.0.1:{port}/route"


class Deployment:
    """n instances (a quarter PrfaaS prefill, a quarter local prefill, half decode) whose loads
    move two at a time, as the router's do between decisions."""

    def __init__(self, n: int) -> None:
        q = max(n // 4, 1)
        self.inst = [InstanceLoad(f"p{i}", "prfaas", "prefill", 0, 0.0) for i in range(q)]
        self.inst += [InstanceLoad(f"l{i}", "local", "prefill", 0, 0.0) for i in range(q)]
        self.inst += [InstanceLoad(f"d{i}", "local", "decode", 0, 0.0) for i in range(n - 2 * q)]
        self.t = 0.0

    def next(self, k: int) -> Snapshot:
        for j in (k % (len(self.inst) // 2), len(self.inst) // 2 + k % (len(self.inst) // 2)):
            i = self.inst[j]
            self.inst[j] = InstanceLoad(i.id, i.cluster, i.role, i.outstanding + 1,
                                        i.outstanding_work + 1000.0)  # fmt: skip
        self.t += 0.05
        return Snapshot(self.t, tuple(self.inst), threshold_tokens=8000.0)


def run(url: str, client: str, n: int, count: int, full: bool) -> tuple[list[float], int]:
    dec = Decider.for_spec(f"{url}#timeout=1s")
    dep = Deployment(n)
    view = RequestView("q", 12000, 200)
    lat: list[float] = []
    fallbacks = 0

    async def go_live() -> None:
        nonlocal fallbacks
        for k in range(count + 50):
            if full:
                dec.policy.encoder.reset()  # type: ignore[attr-defined]
            snap = dep.next(k)
            t0 = time.perf_counter()
            d = await dec.adecide(view, snap)
            if k >= 50:
                lat.append(time.perf_counter() - t0)
                fallbacks += d.decided_by == "fallback"
        await dec.aclose()

    if client == "live":
        asyncio.run(go_live())
    else:
        for k in range(count + 50):  # the first 50 warm up (connection, caches)
            if full:
                dec.policy.encoder.reset()  # type: ignore[attr-defined]
            snap = dep.next(k)
            t0 = time.perf_counter()
            d = dec.decide(view, snap)
            if k >= 50:
                lat.append(time.perf_counter() - t0)
                fallbacks += d.decided_by == "fallback"
        dec.close()
    return lat, fallbacks


def size(n: int, full: bool) -> int:
    from testbed.policy.protocol import DeltaEncoder

    enc, dep, view = DeltaEncoder(), Deployment(n), RequestView("q", 12000, 200)
    enc.encode(dep.next(0))
    enc.commit()
    doc = encode_decision("r-bench", view, enc.encode(dep.next(1), full=full))
    return len(json.dumps(doc, separators=(",", ":")))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--instances", type=int, default=1000)
    ap.add_argument("--decisions", type=int, default=2000)
    ap.add_argument(
        "--report", type=Path, metavar="FILE", help="also write the table into this markdown file"
    )
    args = ap.parse_args()
    setup = (
        f"HTTP services on loopback (echo, examples/least-ttft), {args.instances} instances, "
        f"{args.decisions} decisions per delta row; no seed (the deployment's loads move "
        "deterministically)"
    )
    reported(args.report, "policy_http", "Decision overhead", setup, lambda: measure(args))
    return 0


def measure(args: argparse.Namespace) -> None:
    """Print the table: each service x client x snapshot kind."""
    n = args.instances
    print(f"HTTP policy decisions on loopback, {n} instances, {args.decisions} decisions each "
          f"(wall ms per decision; {os.cpu_count()} CPUs)")  # fmt: skip
    print(f"request size: delta {size(n, False):,} B, full {size(n, True):,} B")
    print(f"{'service':<11} {'client':<6} {'snapshot':<9} {'p50 ms':>8} {'p99 ms':>8} "
          f"{'fallbacks':>9}")  # fmt: skip
    for service in ("echo", "least-ttft"):
        proc, url = start(service)
        try:
            for client in ("sim", "live"):
                for full in (False, True):
                    count = args.decisions if not full else max(args.decisions // 4, 100)
                    lat, fb = run(url, client, n, count, full)
                    p50, p99 = np.percentile(np.asarray(lat) * 1e3, [50, 99])
                    kind = "full" if full else "delta"
                    print(f"{service:<11} {client:<6} {kind:<9} {p50:8.3f} {p99:8.3f} {fb:9d}",
                          flush=True)  # fmt: skip
        finally:
            proc.terminate()
            proc.wait(timeout=10)


if __name__ == "__main__":
    raise SystemExit(main())
