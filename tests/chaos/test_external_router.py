"""Each pinned external router (the `routers` extra: SGLang's gateway, sglang-router, and
vllm-router) routes the emulated fleet live, under a prefill kill: 20 requests over 10 s (inputs
<= 2K tokens, 16 output tokens) at time_scale 1, one PrfaaS prefill SIGKILLed for 4 s, the
fleet speaking the router's flavour of the PD handshake. Nothing is lost from the testbed's
view, every completed request's KV is accounted and verified, the PrfaaS-served ones moved real
KV bytes across the link, the router reached the PrfaaS prefills through the link's
control-path proxies, and its reaction (summary.json's `router_reaction`) shows the kill. Marker
`routers`: `make test` installs the extra; selected without it, the run fails naming it (`make
chaos` leaves it out)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from testbed.scenario.external_run import run_external
from testbed.scenario.plan import RunOptions, prepare_run
from testbed.scenario.schema import scenario_from_data

pytestmark = [
    pytest.mark.chaos,
    pytest.mark.timeout(120),
    pytest.mark.routers,  # the `routers` extra (make test installs it): without it, fails naming it
]

SCENARIO = {
    "name": "external-sglang",
    "seed": 5,
    "duration": "10s",
    "scale": {"time_scale": 1, "byte_scale": 2000},
    "deployments": {
        "prfaas-pd": {
            "kind": "prfaas-pd",
            "prfaas": {"hardware": "h200x8", "instances": 2},
            "local": {"hardware": "h20x8", "instances": 3, "prefill": 1, "decode": 2},
            "link": {"bandwidth": "100Gbps", "rtt": "10ms", "connections": 2},
        }
    },
    "workload": {
        "lengths": {"kind": "lognormal", "mu": 6.5, "sigma": 0.8, "min": 128, "max": "2K"},
        "output_tokens": 16,
        "arrivals": {"process": "uniform", "rate": 2.0},
    },
    "policy": {"name": "prfaas-static", "threshold": "8K"},
    "nemesis": [{"action": "kill", "at": "3s", "for": "4s", "target": "prfaas-prefill-0"}],
}


@pytest.mark.parametrize("preset", ["sglang-router", "vllm-router"])
async def test_the_router_routes_the_fleet_through_a_prefill_kill(
    tmp_path: Path, preset: str
) -> None:
    router = {"kind": "external", "preset": preset, "policy": "round_robin"}
    data = {**SCENARIO, "name": f"external-{preset}", "router": router}
    sc = scenario_from_data(data, tmp_path / f"external-{preset}.yaml")
    opts = RunOptions(out_dir=tmp_path / "out", progress=False, drain_timeout_s=30, timeline=False)
    result = await run_external(prepare_run(sc, opts), opts)
    checks = {c.name: (c.verdict, c.detail) for c in result.checks}
    for name in ("nothing_lost", "kv_accounted", "no_unverified_decode", "generator_count"):
        assert checks[name][0] == "ok", checks
    records = [
        json.loads(line) for line in (tmp_path / "out" / "requests.jsonl").read_text().splitlines()
    ]
    assert len(records) == 20
    done = [r for r in records if r["status"] == "completed"]
    assert done, records
    prfaas = [r for r in done if r["route"] == "prfaas"]
    assert prfaas and all(r["cross_dc"] and r["kv_wire_bytes_received"] > 0 for r in prfaas)
    assert {r["prefill_instance"] for r in done} >= {"local-prefill-0"}
    for r in records:  # a failure is the router's reason as the client got it
        assert r["status"] == "completed" or r["failure_reason"].startswith(("router", "client"))
    history = [
        json.loads(line) for line in (tmp_path / "out" / "history.jsonl").read_text().splitlines()
    ]
    attempts = [e for e in history if e["kind"] == "attempt"]
    assert {a["side"] for a in attempts} == {"prefill", "decode"}
    # the router reaches the PrfaaS prefills through the link's control path: its command line
    # names the proxies, not the instances' own addresses (which the decode halves met them at)
    log = (tmp_path / "out" / "logs" / f"router-{preset}.log").read_text()
    command = log.splitlines()[0].split()
    decodes = [a for a in attempts if a["side"] == "decode"]
    far = {a["prefill_addr"] for a in decodes if a.get("prefill_target", "").startswith("prfaas")}
    assert far and not {f"http://{addr}" for addr in far} & set(command), (far, command)
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    reaction = summary["router_reaction"]
    (kill,) = reaction["faults"]
    assert kill["action"] == "kill" and kill["instances"] == ["prfaas-prefill-0"]
    assert reaction["attempts"]["prefill"] and reaction["attempts"]["decode"]
    assert set(reaction["control_path"]) == {"prfaas-prefill-0", "prfaas-prefill-1"}
    assert sum(reaction["failures"].values()) == summary["requests"]["failed"]
    assert "## Router reaction" in (tmp_path / "out" / "report.md").read_text()
    retried = [r for r in records if r["retries"] > 0]
    print(
        f"{preset}: completed {len(done)}/20, prfaas {len(prfaas)}, retried {len(retried)}, "
        f"failed {[r['failure_reason'] for r in records if r['status'] == 'failed']}, "
        f"kill reaction {kill}"
    )
