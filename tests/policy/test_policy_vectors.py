"""#16 item 2: the shared test vectors (package data, testbed/data/policy-vectors/, written by
make_vectors.py; `testbed policy-vectors URL` runs the decision ones against a service).

Each vector is checked against the protocol's JSON Schemas and run through BOTH forms of a
policy: the Python form (the example's plugin on the decoded snapshot, or a Python policy giving
the vector's answer) and the HTTP form (the example's service, or a service giving that answer,
behind the router's client). Both must agree with the vector, so the two forms of a scheduler
mean the same thing."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from testbed.cli.policy_vectors import VECTORS_DIR
from testbed.policy.base import POLICIES, InstanceLoad, RequestView, Route, Snapshot
from testbed.policy.decider import Decider, fallback_kind
from testbed.policy.http import check_schema
from testbed.policy.protocol import (
    ProtocolError,
    Resync,
    SnapshotMirror,
    decode_request,
    decode_route,
    encode_route,
    snapshot_from_doc,
)
from tests.policy.servers import PROMPT, Replay, example_app, serve

VECTORS = sorted(VECTORS_DIR.glob("*.json"))
DECISIONS = [p for p in VECTORS if not p.stem.startswith("answer-")]
ANSWERS = [p for p in VECTORS if p.stem.startswith("answer-")]


def load(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())


def supported(need: str) -> bool:
    """Whether this testbed's snapshot carries what a vector needs (the richer snapshot of
    #16 item 3 adds `state`, `link` and `costs`)."""
    if need == "state":
        return "state" in {f.name for f in dataclasses.fields(InstanceLoad)}
    return need in {f.name for f in dataclasses.fields(Snapshot)}


def skip_unsupported(vec: dict[str, Any]) -> None:
    missing = [n for n in vec["needs"] if not supported(n)]
    if missing:
        pytest.skip(f"the snapshot has no {', '.join(missing)} yet")


def test_there_are_vectors() -> None:
    assert len(DECISIONS) >= 5 and len(ANSWERS) >= 8


@pytest.mark.parametrize("path", VECTORS, ids=lambda p: p.stem)
def test_vector_fits_the_schemas(path: Path) -> None:
    vec = load(path)
    docs = [s["decision"] for s in vec["steps"]] if "steps" in vec else [vec["decision"]]
    for doc in docs:
        check_schema("decision-request", doc)
    for step in vec.get("steps", ()):
        if step["expect"]["status"] == 200:
            check_schema("decision-response", {"route": step["expect"]["route"]})


def test_the_schemas_refuse_what_the_router_would_refuse() -> None:
    vec = load(DECISIONS[0])
    doc = json.loads(json.dumps(vec["steps"][0]["decision"]))
    doc["snapshot"]["instances"][0][2] = "prefiller"
    with pytest.raises(ProtocolError, match="garbage"):
        check_schema("decision-request", doc)
    with pytest.raises(ProtocolError, match="garbage"):
        check_schema("decision-response", {"route": {"prefill_cluster": "moon"}})


@pytest.fixture(autouse=True)
def _forget_policy_urls() -> Iterator[None]:
    """A policy URL registers as a plugin when first named: drop them after each test, so the
    registry's list of known names stays what other tests expect."""
    yield
    POLICIES.forget_plugins()


# ------------------------------------------------------------------ decision vectors


@pytest.mark.parametrize("path", DECISIONS, ids=lambda p: p.stem)
def test_python_form_agrees(path: Path) -> None:
    from least_ttft.plugin import LeastTTFT

    vec = load(path)
    skip_unsupported(vec)
    policy, mirror = LeastTTFT(), SnapshotMirror()
    for step in vec["steps"]:
        doc, expect = step["decision"], step["expect"]
        try:
            rows = mirror.apply(doc["snapshot"])
        except Resync:
            assert expect["status"] == 409
            continue
        snap = snapshot_from_doc(doc["snapshot"], rows)
        view = decode_request(doc["request"])
        if expect["status"] == 503:
            with pytest.raises(LookupError):
                policy.decide(view, snap)
            continue
        assert expect["status"] == 200
        assert encode_route(policy.decide(view, snap)) == expect["route"]


@pytest.mark.parametrize("path", DECISIONS, ids=lambda p: p.stem)
async def test_http_form_agrees(path: Path) -> None:
    import aiohttp

    vec = load(path)
    with serve(example_app()) as base:
        async with aiohttp.ClientSession() as s:
            for step in vec["steps"]:
                async with s.post(base + "/route", json=step["decision"]) as resp:
                    assert resp.status == step["expect"]["status"]
                    if resp.status == 200:
                        body = await resp.json()
                        check_schema("decision-response", body)
                        assert body["route"] == step["expect"]["route"]


# ------------------------------------------------------------------ answer vectors


class Answering:
    """A Python policy that gives the vector's answer: what a Python scheduler does when it
    raises, returns no Route, or names an instance that is not there."""

    name = "answering"
    deployment_kind = "prfaas-pd"
    needs_threshold = True
    replans = long_term = cache_aware = False

    def __init__(self, status: int, body: str) -> None:
        self.status, self.body = status, body

    def decide(self, request: RequestView, snapshot: Snapshot) -> Route:
        if self.status == 503:
            raise LookupError("no route yet")
        if self.status != 200:
            raise ProtocolError(f"status: HTTP {self.status}")
        try:
            doc = json.loads(self.body)
        except ValueError:
            raise ProtocolError("garbage: not JSON") from None
        return decode_route(doc, snapshot.threshold_tokens)


def expect_decision(
    dec: Decider, view: RequestView, snap: Snapshot, expect: dict[str, Any]
) -> None:
    if expect.get("no_route"):
        with pytest.raises(LookupError):
            dec.decide(view, snap)
        return
    d = dec.decide(view, snap)
    assert d.decided_by == expect["decided_by"], d
    if expect["decided_by"] == "fallback":
        assert fallback_kind(d.fallback_reason) == expect["reason"], d.fallback_reason
        # the fallback is prfaas-static: 12000 uncached tokens > t 8000 -> PrfaaS, least loaded
        assert (d.route.prefill_instance, d.route.decode_instance) == ("prfaas-p1", "pd-d1")
    else:
        assert encode_route(d.route) == expect["route"]


@pytest.mark.parametrize("path", ANSWERS, ids=lambda p: p.stem)
def test_answer_python_form(path: Path) -> None:
    vec = load(path)
    ans = vec["answer"]
    dec = Decider(Answering(ans["status"], ans["body"]), POLICIES["prfaas-static"]())
    snap = snapshot_from_doc(vec["decision"]["snapshot"])
    expect_decision(dec, decode_request(vec["decision"]["request"]), snap, vec["expect"])


@pytest.mark.parametrize("path", ANSWERS, ids=lambda p: p.stem)
def test_answer_http_form(path: Path) -> None:
    vec = load(path)
    ans = vec["answer"]
    with serve(Replay(ans["status"], ans["body"]).app()) as base:
        dec = Decider.for_spec(f"{base}/route#{PROMPT}")
        try:
            snap = snapshot_from_doc(vec["decision"]["snapshot"])
            expect_decision(dec, decode_request(vec["decision"]["request"]), snap, vec["expect"])
        finally:
            dec.close()
