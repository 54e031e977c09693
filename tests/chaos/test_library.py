"""Every scenario of the library, short version (tests/chaos/harness.py), live: its checkers pass,
and none of them is vacuous (each exercised what it checks: a fault with requests to re-route,
requests after a fault's end, completed requests for a percentile).

On top of each scenario's own checkers: nothing is lost (every request the load generator planned
was submitted and ended completed or failed with a reason, counts reconcile), no token was
decoded from unverified KV, and every completed request streamed exactly its output tokens (no
duplicate or missing tokens after a retry or a re-route).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.chaos.harness import LIBRARY, TORCH_SCENARIOS, chaos_variant, run_variant

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(240)]

EXPECTED = {
    "bandwidth-drop",
    "burst",
    "cache-skew",
    "decode-crash",
    "diurnal",
    "jitter",
    "link-flap",
    "mooncake-trace",
    "paper",
    "partition",
    "prefill-crash",
    "real-model",
    "traffic-shift",
}


def test_library_is_complete() -> None:
    assert set(LIBRARY) >= EXPECTED


@pytest.mark.parametrize("name", [n for n in LIBRARY if n not in TORCH_SCENARIOS])
async def test_scenario_passes_its_checkers(name: str, tmp_path: Path) -> None:
    """(The scenarios on the tiny real model run the same short run, with more assertions, in
    tests/scenario/test_torch_live.py: #31 stopped starting it twice.)"""
    sc = chaos_variant(name)
    result = await run_variant(sc, tmp_path)
    failed = [f"{c.name}: {c.verdict}: {c.detail}" for c in result.checks if c.verdict != "ok"]
    assert not failed, "\n".join(failed)  # none failed, and none is vacuous: each tested something
    names = {c.name for c in result.checks}
    assert {"nothing_lost", "kv_accounted", "no_unverified_decode", "generator_count"} <= names
    req = result.summary["requests"]
    assert req["submitted"] == req["completed"] + req["failed"] == len(result.records) > 0
    for r in result.records:
        assert r.status == "completed" or r.failure_reason, r
        if r.tokens_out:
            assert r.kv_verified, r
        if r.status == "completed":
            assert r.tokens_out == r.output_tokens, r
    # every planned fault was applied (start, and end when it has one), without errors
    faults = [e.data for e in result.history if e.kind == "fault"]
    errors = [f for f in faults if "error" in f]
    assert not errors, errors
    for ev in sc.nemesis:
        phases = {f["phase"] for f in faults if f["at"] == ev.at and f["action"] == ev.action}
        assert "start" in phases, ev
        if ev.end is not None and ev.end < sc.duration:
            ends = [f for f in faults if f["action"] == ev.action and f["phase"] == "end"]
            assert ends, ev
