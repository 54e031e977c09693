"""Each checker shown to fail on a deliberately broken variant.

Live (marker chaos): a decode that skips KV verification (the test-only ServiceSpec switch
`unsafe_skip_kv_verify`) fails no_unverified_decode and kv_accounted; a policy that ignores link
state and length (`naive`, everything across the link) fails bandwidth-drop's TTFT bound
during the drop (prfaas, which moves t with the link, passes it). The
other checkers (reroute, recover, latency bounds, failures, generator_count, nothing_lost) are
shown failing on records that such broken runs produce, in test_checkers_scenario.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from testbed.scenario import runner
from testbed.services.spec import ServiceSpec
from tests.chaos.harness import chaos_variant, run_variant

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(240)]


async def test_receiver_skipping_verification_fails_the_kv_checkers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    original = runner._Run._spec

    def broken_spec(self: runner._Run, role: str, sid: str, cluster: str, hw: str) -> ServiceSpec:
        spec = original(self, role, sid, cluster, hw)
        spec.unsafe_skip_kv_verify = role == "decode"
        return spec

    monkeypatch.setattr(runner._Run, "_spec", broken_spec)
    result = await run_variant(chaos_variant("jitter"), tmp_path, duration_s=40)
    checks = {c.name: c for c in result.checks}
    assert not checks["no_unverified_decode"].ok, checks["no_unverified_decode"].detail
    assert not checks["kv_accounted"].ok, checks["kv_accounted"].detail
    assert checks["nothing_lost"].ok  # the run itself is fine: only the KV promise is broken


async def test_policy_ignoring_the_link_fails_bandwidth_drop(tmp_path: Path) -> None:
    result = await run_variant(chaos_variant("bandwidth-drop"), tmp_path, policy="naive")
    failed = {c.name for c in result.checks if not c.ok}
    assert "ttft_p90_during_bandwidth" in failed, [(c.name, c.detail) for c in result.checks]
    # the invariants still hold: slow is not lost
    assert {"nothing_lost", "kv_accounted", "no_unverified_decode"}.isdisjoint(failed)
