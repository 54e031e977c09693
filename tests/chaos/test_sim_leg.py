"""The chaos suite's sim leg: every scenario of the library, full length, on the `sim` substrate
with its checkers, and broken variants that make sense without bytes, caught by the checkers.

- a dropped request (the dispatcher loses one): nothing_lost fails;
- a policy that ignores a partition (`stubborn`, below: every prefill across the link, cut or
  not, and no local fallback when the dispatcher takes PrfaaS out of a request's choices): the
  partition scenario's failures and reroute checkers fail, the invariants still hold;
- a decode that never admits: every request fails at the drain timeout, `failures` fails.

The live leg (test_library.py, test_broken_variants.py) stays; this one costs seconds.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import pytest

from testbed.config import DeploymentKind
from testbed.policy import POLICIES
from testbed.policy.base import RequestView, Route, Snapshot, least_loaded
from testbed.scenario.plan import RunResult
from testbed.scenario.schema import Scenario, load_scenario
from testbed.sim.dispatch import SimDispatcher
from testbed.sim.instances import SimDecode
from tests.chaos.harness import LIBRARY, SCENARIOS, TORCH_SCENARIOS, run_sim_variant

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(120)]


def _sim(sc: Scenario, out: Path, policy: str | None = None) -> RunResult:
    return run_sim_variant(sc, out, policy=policy)


def _shown(result: RunResult) -> list[tuple[str, str, str]]:
    return [(c.name, c.verdict, c.detail) for c in result.checks]


@pytest.mark.parametrize("name", [n for n in LIBRARY if n not in TORCH_SCENARIOS])
def test_every_library_scenario_passes_its_checkers_on_sim(name: str, tmp_path: Path) -> None:
    result = _sim(load_scenario(SCENARIOS / f"{name}.yaml"), tmp_path)
    assert result.ok, _shown(result)
    assert all(c.verdict == "ok" for c in result.checks), _shown(result)  # none vacuous
    assert result.summary["substrate"] == "sim"
    assert result.summary["requests"]["completed"] > 0


def test_a_dropped_request_fails_nothing_lost(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    original = SimDispatcher.submit
    dropped: list[str] = []

    def lossy(self: SimDispatcher, spec: Any) -> None:
        if not dropped and spec.id.endswith("0") and spec.arrival > 30:
            dropped.append(spec.id)  # accepted, then forgotten: no record, no failure
            return
        original(self, spec)

    monkeypatch.setattr(SimDispatcher, "submit", lossy)
    result = _sim(load_scenario(SCENARIOS / "burst.yaml"), tmp_path)
    checks = {c.name: c for c in result.checks}
    assert dropped
    assert not checks["nothing_lost"].ok, checks["nothing_lost"].detail
    assert dropped[0] in checks["nothing_lost"].detail
    assert checks["kv_accounted"].ok


class Stubborn:
    """Every prefill on the least-loaded PrfaaS instance, whatever the link does."""

    name: ClassVar[str] = "stubborn"
    deployment_kind: ClassVar[DeploymentKind] = "prfaas-pd"
    needs_threshold: ClassVar[bool] = False
    replans: ClassVar[bool] = False
    long_term: ClassVar[bool] = False
    cache_aware: ClassVar[bool] = False

    def decide(self, request: RequestView, snapshot: Snapshot) -> Route:
        prefill = least_loaded(snapshot, "prfaas", "prefill")
        decode = least_loaded(snapshot, "local", "decode")
        return Route("prfaas", prefill.id, decode.id, request.input_tokens)


def test_a_policy_ignoring_the_partition_fails_the_partition_checkers(tmp_path: Path) -> None:
    sc = load_scenario(SCENARIOS / "partition.yaml")
    with POLICIES.added(Stubborn):
        result = _sim(sc, tmp_path / "stubborn", policy="stubborn")
    failed = {c.name for c in result.checks if c.failed}
    assert {"failures", "reroute_partition"} <= failed, _shown(result)
    assert any("no route" in reason for reason in result.summary["failures"])
    assert {"nothing_lost", "kv_accounted", "no_unverified_decode"}.isdisjoint(failed)


def test_a_decode_that_never_admits_fails_the_scenario(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(SimDecode, "admit", lambda self, slot: None)
    result = _sim(load_scenario(SCENARIOS / "burst.yaml"), tmp_path)
    checks = {c.name: c for c in result.checks}
    assert not checks["failures"].ok, checks["failures"].detail
    assert checks["nothing_lost"].ok  # every request ends, failed with a reason
    req = result.summary["requests"]
    assert req["failed"] == req["submitted"] > 0
    assert "drain timeout" in next(iter(result.summary["failures"]))
