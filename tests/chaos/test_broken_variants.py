"""Each checker shown to fail on a deliberately broken variant.

Live (marker chaos):

- a deployment that cannot serve (every prefill fails at once: the test-only ServiceSpec switch
  `unsafe_fail_prefill`) fails the scenario's own checkers: `failures` fails, and none of its
  other checkers passes (each fails, or is vacuous because nothing completed). The built-ins
  cannot catch this alone: every request ends failed with a reason, so nothing is lost. Live,
  on as few scenarios as cover every kind of checker the library has (`LIVE_BROKEN`: a latency
  ratio during a fault, re-routing after a kill, throughput, TPOT); on the sim, every
  scenario of the library (a prefill that fails every job at once, the same broken deployment
  in virtual time). The checkers themselves are also shown failing on every library scenario's
  hand-made all-failed records (test_checkers_scenario.py), so the live leg pays for the live
  path once per kind, not once per scenario (#31). The live runs keep each scenario's workload,
  timeline and checkers but play at time_scale 40 (twice the library's short versions): a
  deployment that serves nothing needs no timing fidelity.
- a decode that skips KV verification (the test-only ServiceSpec switch
  `unsafe_skip_kv_verify`) fails no_unverified_decode and kv_accounted;
- a policy that ignores link state and length (`naive`, everything across the link) fails
  bandwidth-drop's TTFT bound during the drop (prfaas, which moves t with the link, passes it).

The checkers (reroute, recover, latency bounds, failures, generator_count, nothing_lost) are
also shown failing, and going vacuous, on hand-made records in test_checkers_scenario.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from testbed.config import ScaleConfig
from testbed.scenario import runner
from testbed.scenario.plan import RunResult
from testbed.scenario.schema import Scenario, load_scenario
from testbed.services.spec import ServiceSpec
from testbed.sim.instances import PrefillJob, SimPrefill
from tests.chaos.harness import (
    LIBRARY,
    SCENARIOS,
    TORCH_SCENARIOS,
    chaos_variant,
    run_sim_variant,
    run_variant,
)

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(240)]

BROKEN_SCALE = ScaleConfig(time_scale=40, byte_scale=2000)
"""The broken variants' scale: the library's short versions at twice their speed."""


def _break_specs(monkeypatch: pytest.MonkeyPatch, **fields: object) -> None:
    """Start every worker (not the router) with these ServiceSpec fields changed."""
    original = runner._Run._spec

    def broken_spec(self: runner._Run, role: str, sid: str, cluster: str, hw: str) -> ServiceSpec:
        spec = original(self, role, sid, cluster, hw)
        return spec if role == "router" else spec.model_copy(update=fields)

    monkeypatch.setattr(runner._Run, "_spec", broken_spec)


LIVE_BROKEN = ("bandwidth-drop", "prefill-crash", "paper", "jitter")
"""Every kind of checker the library has, in as few live runs as cover them: failures, a ttft
ratio and recover (bandwidth-drop), reroute after a kill (prefill-crash), throughput (paper),
tpot (jitter)."""


def test_live_broken_variants_cover_every_checker_kind() -> None:
    kinds = {c.check for n in LIBRARY if n not in TORCH_SCENARIOS
             for c in load_scenario(SCENARIOS / f"{n}.yaml").checkers}  # fmt: skip
    live = {c.check for n in LIVE_BROKEN for c in load_scenario(SCENARIOS / f"{n}.yaml").checkers}
    assert live == kinds


@pytest.mark.parametrize("name", LIVE_BROKEN)
async def test_a_deployment_that_cannot_serve_fails_the_scenario_checkers(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # kv_timeout_s: a decode wait the router's cancel did not reach (it can arrive before the
    # wait starts) ends in 1 s of wall time instead of 120 s, so the run stops promptly.
    _break_specs(monkeypatch, unsafe_fail_prefill=True, kv_timeout_s=1.0)
    sc = chaos_variant(name, scale=BROKEN_SCALE)
    result = await run_variant(sc, tmp_path)
    assert_cannot_serve(sc, result)


@pytest.mark.parametrize("name", [n for n in LIBRARY if n not in TORCH_SCENARIOS])
def test_a_deployment_that_cannot_serve_fails_the_scenario_checkers_on_sim(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def fail_at_once(self: SimPrefill, job: PrefillJob) -> None:
        job.done = True
        self.loop.call_soon(job.on_fail, "prefill failed (broken variant)")

    monkeypatch.setattr(SimPrefill, "submit", fail_at_once)
    sc = load_scenario(SCENARIOS / f"{name}.yaml")
    assert_cannot_serve(sc, run_sim_variant(sc, tmp_path))


def assert_cannot_serve(sc: Scenario, result: RunResult) -> None:
    shown = [(c.name, c.verdict, c.detail) for c in result.checks]
    own = result.checks[len(result.checks) - len(sc.checkers) :]  # the scenario's own
    verdicts = {c.name: c.verdict for c in own}
    assert verdicts.get("failures") == "failed", shown
    assert "ok" not in verdicts.values(), shown  # no checker of the scenario passes
    assert not result.ok
    req = result.summary["requests"]
    assert req["failed"] == req["submitted"] > 0, req  # the variant is broken indeed
    assert {c.name: c.verdict for c in result.checks}["nothing_lost"] == "ok", shown


async def test_receiver_skipping_verification_fails_the_kv_checkers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    original = runner._Run._spec

    def broken_spec(self: runner._Run, role: str, sid: str, cluster: str, hw: str) -> ServiceSpec:
        spec = original(self, role, sid, cluster, hw)
        spec.unsafe_skip_kv_verify = role == "decode"
        return spec

    monkeypatch.setattr(runner._Run, "_spec", broken_spec)
    # 50 s: the jitter starts at 40 s, inside the run (it may end past it)
    result = await run_variant(chaos_variant("jitter"), tmp_path, duration_s=50)
    checks = {c.name: c for c in result.checks}
    assert not checks["no_unverified_decode"].ok, checks["no_unverified_decode"].detail
    assert not checks["kv_accounted"].ok, checks["kv_accounted"].detail
    assert checks["nothing_lost"].ok  # the run itself is fine: only the KV promise is broken


async def test_policy_ignoring_the_link_fails_bandwidth_drop(tmp_path: Path) -> None:
    result = await run_variant(chaos_variant("bandwidth-drop"), tmp_path, policy="naive")
    failed = {c.name for c in result.checks if c.failed}
    assert "ttft_p90_during_bandwidth" in failed, [(c.name, c.detail) for c in result.checks]
    # the invariants still hold: slow is not lost
    assert {"nothing_lost", "kv_accounted", "no_unverified_decode"}.isdisjoint(failed)
