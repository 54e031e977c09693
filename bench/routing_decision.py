"""Cost of one routing decision with 1,000 instances (the router calls this per request).

Builds a snapshot of 1,000 instances (250 PrfaaS prefill, 250 PD-P, 500 PD-D) with random
loads, then times `decide` for 20,000 requests with lengths from the paper's distribution and
random cached prefixes, for each policy. Prints p50 and p99 per decision.
"""

from __future__ import annotations

import statistics
import time

import numpy as np

from testbed.policy import POLICIES, make_policy
from testbed.policy.base import InstanceLoad, RequestView, Snapshot
from testbed.workload.lengths import TruncatedLognormal

N_REQUESTS = 20_000


def snapshot(rng: np.random.Generator, scarce: bool) -> Snapshot:
    instances = []
    for i in range(1000):
        cluster, role = (
            ("prfaas", "prefill")
            if i < 250
            else ("local", "prefill")
            if i < 500
            else ("local", "decode")
        )
        instances.append(
            InstanceLoad(
                f"i{i}", cluster, role, int(rng.integers(0, 20)), float(rng.uniform(0, 1e5))
            )  # type: ignore[arg-type]
        )
    return Snapshot(0.0, tuple(instances), threshold_tokens=19_400, bandwidth_scarce=scarce)


def main() -> None:
    rng = np.random.default_rng(0)
    lengths = TruncatedLognormal(9.9, 1.0, 128, 128_000).sample(rng, N_REQUESTS).astype(int)
    cached = (rng.uniform(0, 1, N_REQUESTS) * lengths).astype(int)
    snap = snapshot(rng, scarce=False)
    print(f"routing decision cost, 1,000 instances, {N_REQUESTS} requests per policy")
    for name in sorted(POLICIES):
        policy = make_policy(name)
        times = []
        for i in range(N_REQUESTS):
            req = RequestView(f"r{i}", int(lengths[i]), 1024, int(cached[i]) if i % 2 else 0,
                              int(cached[i]) if i % 3 == 0 else 0)  # fmt: skip
            t0 = time.perf_counter()
            policy.decide(req, snap)
            times.append(time.perf_counter() - t0)
        q = statistics.quantiles(times, n=100)
        print(f"  {name:15s} p50 {q[49] * 1e6:7.1f} us   p99 {q[98] * 1e6:7.1f} us")


if __name__ == "__main__":
    main()
