"""Live: the router's prefix cache on a tiny loopback deployment (tests/chaos/harness.py).

A crafted trace of multi-turn conversations: each first turn is long (PrfaaS by length) and
each later turn adds a short increment to the previous prompt. Cache-blind routing keeps
sending every turn to PrfaaS by its total length, so each turn's whole KV crosses the link.
Cache-aware routing sees the short increment, keeps later turns on PD-P and pulls the prefix
across once, so fewer bytes cross. No wall-clock thresholds: only counts and bytes.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from testbed.kvcache import BLOCK_TOKENS
from testbed.scenario.plan import RunOptions, RunResult, prepare_run
from testbed.scenario.runner import run_scenario
from testbed.scenario.schema import load_scenario
from tests.chaos.harness import SCENARIOS, TINY

FIRST_BLOCKS = 100  # 51,200 tokens: above the tiny deployment's planned threshold (15K)
STEP_BLOCKS = 2  # +1,024 tokens a turn: far below it


def write_trace(path: Path, conversations: int = 3, turns: int = 4) -> None:
    rows = []
    for c in range(conversations):
        ids = [c * 10_000 + i for i in range(FIRST_BLOCKS)]
        for k in range(turns):
            rows.append(
                {
                    "timestamp": (k * 25 + c * 6) * 1000,  # turns 25 s apart (real-world)
                    "input_length": len(ids) * BLOCK_TOKENS,
                    "output_length": 16,
                    "hash_ids": list(ids),
                }
            )
            ids = ids + [c * 10_000 + len(ids) + i for i in range(STEP_BLOCKS)]
    rows.sort(key=lambda r: r["timestamp"])
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


async def run(tmp_path: Path, policy: str) -> RunResult:
    trace = tmp_path / "conversations.jsonl"
    write_trace(trace)
    base = load_scenario(SCENARIOS / "mooncake-trace.yaml")
    sc = base.model_copy(
        update={
            "deployments": {"tiny": TINY},
            "deployment": "tiny",
            "scale": base.scale.model_copy(update={"time_scale": 20, "byte_scale": 2000}),
            "workload": base.workload.model_copy(
                update={
                    "trace": str(trace),
                    "arrivals": base.workload.arrivals.model_copy(update={"load": None}),
                }
            ),
            "duration": 100.0,
            "checkers": [],
        }
    )
    opts = RunOptions(out_dir=tmp_path / policy, progress=False, policy=policy, drain_timeout_s=60)
    return await run_scenario(prepare_run(sc, opts), opts)


@pytest.mark.slow
def test_cache_aware_routing_hits_pulls_and_crosses_fewer_bytes(tmp_path: Path) -> None:
    aware = asyncio.run(run(tmp_path, "prfaas"))
    blind = asyncio.run(run(tmp_path, "prfaas-nocache"))
    for result in (aware, blind):
        assert result.summary["requests"]["failed"] == 0, result.summary["failures"]
        assert all(r.kv_verified for r in result.records)

    a_cache, b_cache = aware.summary["prefix_cache"], blind.summary["prefix_cache"]
    # cache-blind still reuses the cache of the cluster it lands in (PrfaaS, every turn)
    assert b_cache["clusters"]["prfaas"]["hit_tokens"] > 0
    assert b_cache["pulls"]["asked"] == 0
    # cache-aware: later turns go local after one pull per conversation, then hit locally
    assert a_cache["clusters"]["local"]["hit_tokens"] > 0
    pulls = a_cache["pulls"]
    assert pulls["ok"] >= 1 and pulls["failed"] == 0 and pulls["bytes"] > 0
    pulled = [r for r in aware.records if r.pull_status == "ok"]
    assert all(r.route == "local" and r.pull_wire_bytes > 0 for r in pulled)
    # the pull's bytes went through the link proxy: the link counted at least KV + pulls
    s = aware.summary["scale"]["bytes"]
    wire_kv_and_pulls = sum(r.kv_wire_bytes_received for r in aware.records if r.cross_dc) + sum(
        r.pull_wire_bytes for r in aware.records
    )
    assert aware.summary["link"]["bytes"] >= wire_kv_and_pulls * s * 0.999
    # fewer bytes across the datacenters, KV and pulls together
    assert aware.summary["cross_dc_bytes"]["total"] < blind.summary["cross_dc_bytes"]["total"]


def test_router_rejects_bad_hash_ids() -> None:
    """A bad hash_ids list is a 400 before anything is dispatched."""

    async def go() -> list[int]:
        from aiohttp.test_utils import TestClient, TestServer

        from testbed.services.router import create_app
        from testbed.services.spec import ServiceSpec

        app, _ = await create_app(ServiceSpec(role="router", id="r", policy="homogeneous"))
        statuses = []
        async with TestClient(TestServer(app)) as client:
            for hash_ids in ([1, "x"], [True], list(range(3)), "abc"):
                body = {"input_tokens": 1024, "output_tokens": 1, "hash_ids": hash_ids}
                resp = await client.post("/generate", json=body)
                statuses.append(resp.status)
        return statuses

    statuses = asyncio.run(go())
    assert statuses == [400, 400, 400, 400]  # 3 ids for 1,024 tokens exceeds ceil(1024/512)
