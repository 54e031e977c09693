"""What the runner tells each service and the link, from the scenario: `_Run.start()` against a
substrate that only records what it is asked to start (no process, no socket). Each scenario
field that a service or the link acts on shows up, moved, in the specs or the link request;
the services' own tests show what they do with it (tests/test_no_silent_fields.py pairs them).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from testbed.config import DeploymentConfig, LinkConfig, ScaleConfig
from testbed.link.deployment import LinkSetup
from testbed.scenario.plan import RunOptions, prepare_run
from testbed.scenario.runner import _Run
from testbed.scenario.schema import Scenario
from testbed.services.spec import ServiceSpec
from testbed.substrate.base import ServiceHandle

BASE: dict[str, Any] = {
    "name": "specs",
    "seed": 5,
    "duration": "30s",
    "scale": {"time_scale": 20, "byte_scale": 500},
    "deployments": {
        "pd": {
            "kind": "prfaas-pd",
            "prfaas": {"hardware": "h200x8", "instances": 2, "prefix_cache": "1TiB"},
            "local": {"hardware": "h20x8", "instances": 4, "prefill": 1, "prefix_cache": "2TiB"},
            "link": {"bandwidth": "40Gbps", "rtt": "12ms", "jitter": "3ms", "connections": 3},
        }
    },
    "workload": {
        "lengths": {"kind": "fixed", "tokens": 5000},
        "output_tokens": 256,
        "arrivals": {"process": "uniform", "rate": 1.0},
    },
    "slo": {"decode_tokens_per_s": 50},
    "policy": {
        "name": "prfaas",
        "threshold": "6K",
        "short_term": {"interval": "3s", "cooldown": "7s"},
        "long_term": {"window": "40s", "role_switch": "9s"},
    },
    "planner": {"threshold_step": 250},
}


class RecordingSubstrate:
    """Records every spec and the link request; hands back addresses nothing listens on."""

    name = "recording"

    def __init__(self) -> None:
        self.specs: list[ServiceSpec] = []
        self.link: dict[str, Any] = {}
        self.warmed: list[str] = []

    async def warm(self, roles: list[str], link: LinkConfig | None, seed: int) -> None:
        self.warmed = list(roles)

    async def start_service(self, spec: ServiceSpec) -> ServiceHandle:
        self.specs.append(spec)
        n = len(self.specs)
        kv = ("127.0.0.1", 20_000 + n) if spec.role in ("decode", "pd") else None
        return ServiceHandle(spec, f"http://127.0.0.1:{10_000 + n}", kv)

    async def start_link(
        self,
        link: LinkConfig,
        scale: ScaleConfig,
        upstreams: dict[str, tuple[str, int]],
        *,
        enabled: bool,
        seed: int,
    ) -> LinkSetup:
        self.link = {"link": link, "scale": scale, "enabled": enabled, "seed": seed}
        return LinkSetup(dict(upstreams), scale, link.bandwidth)

    async def stop_all(self) -> None:
        return None


async def start(tmp_path: Path, deployment: Any = None, **over: Any) -> RecordingSubstrate:
    """Start the scenario (BASE with `over`) against the recorder; `deployment` replaces the
    planned one (an `engine: torch` one, which prepare_run would check for torch)."""
    doc = {**BASE, **over}
    rp = prepare_run(Scenario.model_validate(doc), RunOptions(out_dir=tmp_path))
    if deployment is not None:
        rp = dataclasses.replace(rp, deployment=DeploymentConfig.model_validate(deployment))
    run = _Run(rp, RunOptions(out_dir=tmp_path))
    sub = RecordingSubstrate()
    run.substrate = sub  # type: ignore[assignment]
    await run.start()
    return sub


def by_id(sub: RecordingSubstrate) -> dict[str, ServiceSpec]:
    return {s.id: s for s in sub.specs}


async def test_every_service_gets_the_runs_scale_model_slo_and_seeds(tmp_path: Path) -> None:
    sub = await start(tmp_path)
    assert len(sub.specs) == 2 + 4 + 1
    for s in sub.specs:
        assert (s.time_scale, s.byte_scale) == (20.0, 500.0)
        assert s.tpot_slo_s == pytest.approx(1 / 50)
        assert (s.model, s.engine, s.prompt_seed) == ("internal-1t-hybrid", "emulated", 5)
        assert s.connections == 3


async def test_the_engine_and_the_tiny_models_seed_and_dtype(tmp_path: Path) -> None:
    torch = {
        **BASE["deployments"]["pd"],
        "engine": "torch",
        "tiny_model": {"seed": 9, "dtype": "float64"},
    }
    sub = await start(tmp_path, deployment=torch)
    for s in sub.specs:
        assert (s.engine, s.model_seed, s.model_dtype) == ("torch", 9, "float64")


async def test_clusters_hardware_and_instances(tmp_path: Path) -> None:
    specs = by_id(await start(tmp_path))
    prfaas = [s for s in specs.values() if s.cluster == "prfaas"]
    assert [s.id for s in prfaas] == ["prfaas-prefill-0", "prfaas-prefill-1"]
    assert {s.hardware for s in prfaas} == {"h200x8"}
    assert specs["local-decode-0"].hardware == "h20x8"
    local = [s for s in specs.values() if s.cluster == "local" and s.role != "router"]
    assert len(local) == 4


async def test_the_router_gets_policy_threshold_cache_and_scheduler(tmp_path: Path) -> None:
    router = by_id(await start(tmp_path))["router"]
    assert (router.policy, router.threshold_tokens) == ("prfaas", 6000.0)
    assert router.prefix_cache_bytes == {"prfaas": 2**40, "local": 2 * 2**40}
    sch = router.scheduler
    assert sch is not None
    assert sch.threshold_step == 250 and sch.output_tokens == 256 and sch.n_local == 4
    assert sch.short_term.interval == 3.0 and sch.short_term.cooldown == 7.0
    assert sch.long_term is not None and sch.long_term.window == 40.0
    assert sch.tpot_slo_s == pytest.approx(1 / 50)
    assert sch.deployment.link.bandwidth == 40e9 / 8
    ids = {i.id: i for i in router.instances}
    assert ids["local-decode-0"].switchable and ids["local-decode-0"].kv_port is not None


async def test_the_long_term_loop_makes_pd_instances_with_its_switch_time(tmp_path: Path) -> None:
    specs = by_id(await start(tmp_path))
    pd = [s for s in specs.values() if s.role == "pd"]
    assert len(pd) == 4 and {s.role_switch_s for s in pd} == {9.0}
    assert {s.initial_role for s in pd} == {"prefill", "decode"}
    static = by_id(await start(tmp_path, policy={"name": "prfaas-static", "threshold": "6K"}))
    assert not any(s.role == "pd" for s in static.values())
    assert static["router"].scheduler is None


async def test_the_link_request_carries_the_links_config_and_the_seed(tmp_path: Path) -> None:
    sub = await start(tmp_path)
    link = sub.link["link"]
    assert (link.bandwidth, link.rtt, link.jitter) == (40e9 / 8, 0.012, 0.003)
    assert sub.link["seed"] == 5 and sub.link["enabled"] is True
    assert sub.link["scale"] == ScaleConfig(time_scale=20, byte_scale=500)


@pytest.mark.parametrize("policy", [None, {"name": "prfaas-static", "threshold": "6K"}])
async def test_the_substrate_is_warmed_for_exactly_the_services_started(
    tmp_path: Path, policy: dict[str, str] | None
) -> None:
    """The runner asks the substrate for one warm process per service it then starts, by role
    (pd instances under the long-term loop, decode and prefill without it)."""
    sub = await start(tmp_path, **({"policy": policy} if policy else {}))
    assert sorted(sub.warmed) == sorted(s.role for s in sub.specs)
