"""The long-term loop live: a traffic shift on a small deployment converts PD-D instances to
PD-P while requests keep flowing, and nothing is lost or decoded from unverified KV."""

from __future__ import annotations

from pathlib import Path

import aiohttp
import pytest

from testbed.config import DeploymentConfig, LongTermConfig, ScaleConfig
from testbed.scenario.plan import RunOptions, prepare_run
from testbed.scenario.runner import run_scenario
from testbed.scenario.schema import load_scenario
from testbed.scenario.sim_run import run_sim

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

ROOT = Path(__file__).resolve().parents[2]

SMALL = DeploymentConfig.model_validate(
    {
        "kind": "prfaas-pd",
        "prfaas": {"hardware": "h200x8", "instances": 2},
        "local": {"hardware": "h20x8", "instances": 5},  # the split is the planner's, free
        "link": {"bandwidth": "100Gbps", "rtt": "20ms", "connections": 2},
    }
)


def _scenario(policy: str):  # type: ignore[no-untyped-def]
    sc = load_scenario(ROOT / "scenarios" / "traffic-shift.yaml")
    fast = LongTermConfig(interval=5.0, sustain=2, window=20.0, min_samples=15)
    return sc.model_copy(
        update={
            "deployments": {"small": SMALL},
            "deployment": "small",
            "scale": ScaleConfig(time_scale=20, byte_scale=2000),
            "duration": 300.0,
            "checkers": [],
            "policy": sc.policy.model_copy(update={"name": policy, "long_term": fast}),
        }
    )


async def _run(policy: str, out: Path):  # type: ignore[no-untyped-def]
    sc = _scenario(policy)
    opts = RunOptions(out_dir=out, progress=False, drain_timeout_s=90)
    rp = prepare_run(sc, opts)
    assert rp.shift_plan is not None and rp.shift_plan.n_prefill > rp.n_prefill
    return rp, await run_scenario(rp, opts)


async def test_shift_to_long_prompts_converts_decode_to_prefill(tmp_path: Path) -> None:
    rp, result = await _run("prfaas", tmp_path)
    failed = [f"{c.name}: {c.detail}" for c in result.checks if not c.ok]
    assert not failed, failed  # nothing lost, KV accounted, nothing unverified decoded
    assert all(r.status == "completed" for r in result.records)
    splits = [e.data for e in result.history if e.kind == "split"]
    assert splits, [e.data for e in result.history if e.kind == "split_check"]
    assert splits[0]["converted"] and splits[0]["n_prefill"] > rp.n_prefill
    switched = {e.data["instance"] for e in result.history if e.kind == "switched"}
    assert switched <= {f"local-decode-{i}" for i in range(rp.n_decode)}
    # converted instances really served prefill afterwards
    assert any(r.prefill_instance in switched for r in result.records)
    # the decision came from the shift, after it
    act = [e for e in result.history if e.kind == "split_check" and e.data["act"]]
    assert act and act[0].t > 100.0


def test_without_the_long_term_loop_the_split_stays(tmp_path: Path) -> None:
    """The negative control, on the sim (the same control loops in virtual time; #31 moved it
    off the live leg, where the positive case above runs): without the long-term loop nothing
    splits, switches or drains, and local prefills stay on the PD-P instances; with it, the
    same run on the sim does split (so this control can fail)."""
    for policy, converts in (("prfaas-nolongterm", False), ("prfaas", True)):
        opts = RunOptions(substrate="sim", out_dir=tmp_path / policy, progress=False,
                          drain_timeout_s=90, timeline=False)  # fmt: skip
        rp = prepare_run(_scenario(policy), opts)
        result = run_sim(rp, opts)
        assert all(r.status == "completed" for r in result.records), policy
        moved = [e for e in result.history if e.kind in ("split", "switched", "drain")]
        assert bool(moved) == converts, (policy, moved[:3])
        if not converts:
            used = {r.prefill_instance for r in result.records if r.route == "local"}
            assert used <= {f"local-prefill-{i}" for i in range(rp.n_prefill)}


async def test_role_switch_refuses_work_for_the_inactive_role(tmp_path: Path) -> None:
    """A switchable instance started as decode refuses prefill work (409) on the live path."""
    from testbed.services.pd import PREFILL_PREFIX
    from testbed.substrate.local import LocalSubstrate

    sub = LocalSubstrate(tmp_path)
    from testbed.services.spec import ServiceSpec

    spec = ServiceSpec(role="pd", id="local-decode-0", initial_role="decode", time_scale=20)
    try:
        h = await sub.start_service(spec)
        assert h.kv_addr is not None
        async with aiohttp.ClientSession() as s:
            body = {"id": "x", "uncached_tokens": 10, "kv_host": "127.0.0.1", "kv_port": 1}
            async with s.post(f"{h.url}{PREFILL_PREFIX}/prefill", json=body) as r:
                assert r.status == 409
            async with s.get(f"{h.url}/role") as r:
                assert (await r.json())["role"] == "decode"
    finally:
        await sub.stop_all()
