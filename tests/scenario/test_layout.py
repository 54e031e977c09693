"""The run plan owns the layout (testbed.substrate.layout): instance ids, whether the local
instances switch roles, the scheduler loops' spec and the starting events are decided once by
prepare_run, the same for every substrate, and the sim stands up exactly those instances."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from testbed.nemesis import instance_ids
from testbed.scenario.library import resolve_scenario
from testbed.scenario.plan import RunOptions, RunPlan, prepare_run
from testbed.scenario.schema import load_scenario
from testbed.scenario.sim_run import sim_inputs
from testbed.sim import simulate

PACKAGE = Path(__file__).resolve().parents[2] / "testbed"


def _plan(name: str, substrate: str, policy: str | None = None, **over: float) -> RunPlan:
    return prepare_run(
        load_scenario(resolve_scenario(name)),
        RunOptions(substrate=substrate, policy=policy, **over),
    )


@pytest.mark.parametrize(("name", "policy"), [("burst", None), ("traffic-shift", "prfaas")])
def test_every_substrate_gets_the_same_layout(name: str, policy: str | None) -> None:
    layouts = {s: _plan(name, s, policy).layout for s in ("local", "compose", "sim")}
    assert layouts["local"] == layouts["compose"] == layouts["sim"]


def test_ids_scheduler_and_events_come_from_the_plan() -> None:
    rp = _plan("traffic-shift", "sim", "prfaas")
    lay = rp.layout
    n_far = rp.deployment.prfaas.instances if rp.deployment.prfaas else 0
    assert lay.workers == instance_ids(n_far, rp.n_prefill, rp.n_decode)
    assert lay.local_decode[0] == "local-decode-0" and lay.prfaas_prefill[-1].startswith("prfaas")
    # a re-planning policy on a PrfaaS deployment: switchable PD instances, both loops
    assert lay.switchable and lay.scheduler is not None and lay.scheduler.long_term is not None
    assert lay.scheduler.n_prefill == rp.n_prefill
    kinds = [(e.t, e.kind) for e in lay.start_events()]
    assert kinds == [(0.0, "policy"), (0.0, "plan")]
    assert lay.plan_event["shift_at"] is not None
    assert lay.start_events()[1].data is not lay.start_events()[1].data  # fresh each time


def test_a_static_policy_runs_no_loops_and_keeps_the_split() -> None:
    lay = _plan("burst", "local").layout
    assert not lay.switchable and lay.scheduler is None


def test_the_sim_stands_up_the_layouts_instances_and_starts_its_history() -> None:
    rp = _plan("burst", "sim", duration_s=20.0)
    out = simulate(sim_inputs(rp, RunOptions(substrate="sim")))
    engines = [e.data["instance"] for e in out.history if e.kind == "engine"]
    assert sorted(engines) == sorted(rp.layout.workers)
    at_zero = [(e.kind, e.data) for e in out.history if e.kind in ("policy", "plan")][:2]
    assert at_zero == [(e.kind, e.data) for e in rp.layout.start_events()]


def test_no_module_but_the_layout_names_an_instance_or_builds_a_scheduler_spec() -> None:
    """The copies the layout replaced (runner, sim, nemesis) stay gone: an f-string naming an
    instance of a group, or a SchedulerSpec(...) call, appears once in testbed/."""
    named: list[str] = []
    specs: list[str] = []
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        where = str(path.relative_to(PACKAGE.parent))
        for node in ast.walk(tree):
            if isinstance(node, ast.JoinedStr) and node.values:
                head = node.values[0]
                if isinstance(head, ast.Constant) and str(head.value).endswith(
                    ("prefill-", "decode-")
                ):
                    named.append(f"{where}:{node.lineno}")
            if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "SchedulerSpec":
                specs.append(f"{where}:{node.lineno}")
    assert named == [], named  # testbed/nemesis/process.py's group_ids writes `{group}-{i}`
    assert [s.split(":")[0] for s in specs] == ["testbed/scenario/plan.py"], specs
