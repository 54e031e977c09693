"""Write the shared test vectors, testbed/data/policy-vectors/*.json (run by hand when the
protocol changes; not a test).

They ship as package data, so `testbed policy-vectors URL` (testbed/cli/policy_vectors.py) runs
them against an outside author's service from a pip-installed testbed, with no test source;
tests/policy/test_policy_vectors.py reads the same files. `python tests/policy/make_vectors.py`
from the repository root (examples/least-ttft is put on the path). Each vector is a
sequence of steps sent by one router: a decision document (built with the router's own
encoder, so the vectors are what a router really sends) and what either form of a policy must
do with it: `route` (HTTP 200), `no_route` (HTTP 503 / LookupError) or `resync` (HTTP 409).
An `answer` vector is instead a service's raw answer and what the router's shared failure
semantics must make of it (testbed.policy.decider), for the Python and the HTTP form alike.
"""

# ruff: noqa: E501 - a vector's description stays one line

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from testbed.cli.policy_vectors import VECTORS_DIR
from testbed.policy.base import InstanceLoad, RequestView, Snapshot
from testbed.policy.protocol import DeltaEncoder, encode_decision

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples" / "least-ttft"))

from least_ttft.server import Service

COSTS = {
    "prefill_knots": {
        "prfaas": [[0, 8000, 32000], [0, 0.5, 2.4]],
        "local": [[0, 8000, 32000], [0, 1.5, 7.0]],
    },
    "kv_knots": [[0, 32000], [0, 2.0e9]],
}
LINK = {
    "bandwidth_bps": 1.25e10,
    "in_flight_bytes": 4.0e10,
    "delivered_bps": 1.0e10,
    "rtt_s": 0.02,
    "scarce": False,
}


def inst(iid: str, cluster: str, role: str, n: int, work: float) -> InstanceLoad:
    return InstanceLoad(iid, cluster, role, n, work)  # type: ignore[arg-type]


BASE = (
    inst("prfaas-p0", "prfaas", "prefill", 2, 30000.0),
    inst("prfaas-p1", "prfaas", "prefill", 0, 0.0),
    inst("pd-p0", "local", "prefill", 1, 2000.0),
    inst("pd-d0", "local", "decode", 4, 900.0),
    inst("pd-d1", "local", "decode", 2, 300.0),
    inst("pd-d2", "local", "decode", 3, 500.0),
)


def with_extras(
    doc: dict[str, Any],
    *,
    costs: bool = False,
    link: bool = False,
    states: dict[str, str] | None = None,
    waits: dict[str, float] | None = None,
) -> None:
    snap = doc["snapshot"]
    if costs:
        snap["costs"] = COSTS
    if link:
        snap["link"] = LINK
    for row in snap["instances"]:
        if states and row[0] in states:
            row[6] = states[row[0]]
        if waits and row[0] in waits:
            row[5] = waits[row[0]]


def steps(service: Service, docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for doc in docs:
        status, body = service.decide(json.loads(json.dumps(doc)))
        expect: dict[str, Any] = {"status": status}
        if status == 200:
            expect["route"] = body["route"]
        out.append({"decision": doc, "expect": expect})
    return out


def decision_vectors() -> dict[str, dict[str, Any]]:
    v: dict[str, dict[str, Any]] = {}
    req = RequestView("q1", 12000, 200, cached_local=0, cached_prfaas=0)

    enc = DeltaEncoder()
    doc = encode_decision("r-vec", req, enc.encode(Snapshot(10.0, BASE, 8000.0)))
    v["least-ttft-full"] = {
        "needs": [],
        "description": "A full snapshot without costs or link: least queued work plus the request's tokens at the default rate; decode least loaded.",
        "steps": steps(Service(), [doc]),
    }

    enc = DeltaEncoder()
    doc = encode_decision("r-vec", req, enc.encode(Snapshot(10.0, BASE, 8000.0)))
    with_extras(doc, costs=True, link=True)
    v["least-ttft-costs-link"] = {
        "needs": ["costs", "link"],
        "description": "Cost curves and the link estimate: the KV trip (40 GB in flight ahead of it) makes the local PD-P win.",
        "steps": steps(Service(), [doc]),
    }

    enc = DeltaEncoder()
    doc = encode_decision("r-vec", req, enc.encode(Snapshot(10.0, BASE, 8000.0)))
    with_extras(doc, states={"prfaas-p1": "draining", "pd-d1": "suspect"})
    v["least-ttft-states"] = {
        "needs": ["state"],
        "description": "Instances not ok are never chosen (the idle PrfaaS prefill drains, the idlest decode is suspect).",
        "steps": steps(Service(), [doc]),
    }

    enc = DeltaEncoder()
    doc = encode_decision("r-vec", req, enc.encode(Snapshot(10.0, BASE[:3], 8000.0)))
    v["least-ttft-no-decode"] = {
        "needs": [],
        "description": "No decode instance: no route yet (503; LookupError in Python).",
        "steps": steps(Service(), [doc]),
    }

    enc = DeltaEncoder()
    first = encode_decision("r-vec", req, enc.encode(Snapshot(10.0, BASE, 8000.0)))
    enc.commit()
    moved = (BASE[0], inst("prfaas-p1", "prfaas", "prefill", 3, 40000.0), *BASE[2:5])
    second = encode_decision(
        "r-vec", RequestView("q2", 3000, 100), enc.encode(Snapshot(11.0, moved, 8000.0))
    )
    v["least-ttft-delta"] = {
        "needs": [],
        "description": "A full snapshot, then a delta: one row changed, pd-d2 left.",
        "steps": steps(Service(), [first, second]),
    }

    enc = DeltaEncoder()
    enc.encode(Snapshot(10.0, BASE, 8000.0))
    enc.commit()
    delta = encode_decision("r-vec", req, enc.encode(Snapshot(11.0, BASE, 8000.0)))
    full = encode_decision("r-vec", req, enc.encode(Snapshot(11.0, BASE, 8000.0), full=True))
    v["least-ttft-resync"] = {
        "needs": [],
        "description": "A delta on a base the service never saw: 409 resync; the full snapshot that follows is answered.",
        "steps": steps(Service(), [delta, full]),
    }
    return v


def answer_vectors() -> dict[str, dict[str, Any]]:
    enc = DeltaEncoder()
    doc = encode_decision(
        "r-vec", RequestView("q1", 12000, 200), enc.encode(Snapshot(10.0, BASE, 8000.0))
    )
    good = {
        "prefill_cluster": "prfaas",
        "prefill_instance": "prfaas-p1",
        "decode_instance": "pd-d1",
        "uncached_tokens": 12000,
        "pull_prefix_tokens": 0,
    }

    def route(**kw: Any) -> str:
        return json.dumps({"protocol": "prfaas-policy/1", "route": {**good, **kw}})

    cases = {
        "answer-ok": (200, route(), {"decided_by": "policy", "route": good}),
        "answer-not-json": (
            200,
            "<html>oops</html>",
            {"decided_by": "fallback", "reason": "garbage"},
        ),
        "answer-no-route-object": (
            200,
            json.dumps({"protocol": "prfaas-policy/1"}),
            {"decided_by": "fallback", "reason": "garbage"},
        ),
        "answer-negative-tokens": (
            200,
            route(uncached_tokens=-5),
            {"decided_by": "fallback", "reason": "garbage"},
        ),
        "answer-unknown-instance": (
            200,
            route(prefill_instance="prfaas-p9"),
            {"decided_by": "fallback", "reason": "unknown-instance"},
        ),
        "answer-wrong-role": (
            200,
            route(decode_instance="pd-p0"),
            {"decided_by": "fallback", "reason": "wrong-role"},
        ),
        "answer-wrong-cluster": (
            200,
            route(prefill_cluster="local"),
            {"decided_by": "fallback", "reason": "wrong-cluster"},
        ),
        "answer-503": (503, json.dumps({"error": "busy"}), {"no_route": True}),
        "answer-500": (500, "internal error", {"decided_by": "fallback", "reason": "status"}),
    }
    return {
        name: {
            "needs": [],
            "description": f"The service answers HTTP {status}: {body[:60]}",
            "answer": {"status": status, "body": body},
            "decision": doc,
            "expect": expect,
        }
        for name, (status, body, expect) in cases.items()
    }


def main() -> None:
    VECTORS_DIR.mkdir(exist_ok=True)
    for name, vec in {**decision_vectors(), **answer_vectors()}.items():
        (VECTORS_DIR / f"{name}.json").write_text(
            json.dumps({"name": name, **vec}, indent=1) + "\n"
        )
        print(name)


if __name__ == "__main__":
    main()
