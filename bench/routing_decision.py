"""Cost of one routing decision with 10,000 instances (the router calls this per request).

Keeps 10,000 instances (2,500 PrfaaS prefill, 2,500 PD-P, 5,000 PD-D) in a `LoadBook`, the
index the live router and the sim keep their load in (testbed.policy.book), starting from random
loads. Per request it times what the router does per decision: make the policy's snapshot from
the book and `decide` (lengths from the paper's distribution, random cached prefixes); then,
untimed, charges the chosen instances and releases an earlier request's charge (loads keep
moving, so the index's heaps see the churn of a real run). Prints p50 and p99 per decision for
each policy. `--instances` changes the size (the older figure: ~200 us p50 at 1,000, when every
snapshot was rebuilt per decision).

Usage: python bench/routing_decision.py [--instances 10000] [--requests 20000] [--report FILE]
Target (issue #15): p99 <= 100 us at 10,000 instances.
"""

from __future__ import annotations

import argparse
import collections
import os
import statistics
import time
from pathlib import Path

import numpy as np
from provenance import reported  # bench/ is on sys.path

from testbed.policy import POLICIES, make_policy
from testbed.policy.base import Cluster, CostModel, RequestView
from testbed.policy.book import BookEntry, LoadBook
from testbed.profiles import MODELS
from testbed.workload.lengths import TruncatedLognormal

HARDWARE = {"prfaas": "h200x8", "local": "h20x8"}


def book(rng: np.random.Generator, n: int) -> LoadBook:
    entries = []
    for i in range(n):
        cluster: Cluster = "prfaas" if i < n // 4 else "local"
        role = "prefill" if i < n // 2 else "decode"
        entries.append(BookEntry(f"i{i}", cluster, role, HARDWARE[cluster]))
    model = MODELS["internal-1t-hybrid"]
    b = LoadBook(entries, set(), CostModel.of(model, HARDWARE))
    for e in entries:  # a random starting load
        for _ in range(int(rng.integers(0, 4))):
            if e.role == "prefill":
                b.charge(e.id, float(rng.uniform(0, 3e4)), None, 0.0, 1)
            else:
                b.charge(None, 0.0, e.id, 1024.0, 1)
    return b


def time_policy(name: str, instances: int, lengths: np.ndarray, cached: np.ndarray) -> None:
    """Time `name`'s snapshot + decide over the requests (`lengths` input tokens, `cached` of
    them in a prefix cache) on a book of `instances`; print its p50 and p99."""
    model = MODELS["internal-1t-hybrid"]
    b = book(np.random.default_rng(1), instances)
    policy = make_policy(name)
    in_flight: collections.deque[tuple[str | None, float, str | None]] = collections.deque()
    times = []
    for i in range(len(lengths)):
        n_in = int(lengths[i])
        req = RequestView(f"r{i}", n_in, 1024, int(cached[i]) if i % 2 else 0,
                          int(cached[i]) if i % 3 == 0 else 0,
                          model.kv_bytes(n_in))  # fmt: skip
        t0 = time.perf_counter()
        snap = b.snapshot(float(i), 19_400.0, i % 7 == 0)
        route = policy.decide(req, snap)
        times.append(time.perf_counter() - t0)
        charge = (route.prefill_instance, float(n_in), route.decode_instance)
        b.charge(charge[0], charge[1], charge[2], 1024.0, 1)
        in_flight.append(charge)
        if len(in_flight) > instances // 2:  # a steady state: one ends per one begun
            pre, tok, dec = in_flight.popleft()
            b.charge(pre, tok, dec, 1024.0, -1)
    q = statistics.quantiles(times, n=100)
    print(f"  {name:15s} p50 {q[49] * 1e6:7.1f} us   p99 {q[98] * 1e6:7.1f} us")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--instances", type=int, default=10_000)
    ap.add_argument("--requests", type=int, default=20_000)
    ap.add_argument("--report", type=Path, metavar="FILE", help="also write the table here")
    args = ap.parse_args()
    setup = (
        f"the policies alone on a load book of {args.instances:,} instances, "
        f"{args.requests:,} requests each, seed 0"
    )
    reported(args.report, "routing_decision", "A routing decision", setup, lambda: measure(args))
    return 0


def measure(args: argparse.Namespace) -> None:
    """Print each policy's p50 and p99 per decision."""
    n_req = args.requests
    rng = np.random.default_rng(0)
    lengths = TruncatedLognormal(9.9, 1.0, 128, 128_000).sample(rng, n_req).astype(int)
    cached = (rng.uniform(0, 1, n_req) * lengths).astype(int)
    print(
        f"routing decision cost (snapshot from the load book + decide), {args.instances:,} "
        f"instances, {n_req} requests per policy; load average {os.getloadavg()[0]:.1f}"
    )
    for name in sorted(POLICIES):
        time_policy(name, args.instances, lengths, cached)


if __name__ == "__main__":
    raise SystemExit(main())
