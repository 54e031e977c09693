"""The long-term loop: the controller's decision rule, the switchable PD instance and the
traffic shift in the workload generator."""

from __future__ import annotations

import asyncio

import aiohttp
import numpy as np
import pytest

from testbed.config import LognormalLengths, ShiftConfig
from testbed.planner import PlanInputs, StagePlan, plan_deployment
from testbed.scenario.schema import Scenario
from testbed.scheduler.longterm import LongTermController, StagePressure
from testbed.services.pd import DECODE_PREFIX, PREFILL_PREFIX
from testbed.services.pd import create_app as pd_app
from testbed.services.spec import ServiceSpec
from testbed.workload.build import length_distribution
from testbed.workload.generate import generate_requests

HOT = StagePressure(prefill=2.0, decode=1.0)


def _scenario(mu: float = 11.0) -> Scenario:
    return Scenario.model_validate(
        {
            "description": "t",
            "seed": 1,
            "duration": "300s",
            "deployments": {
                "prfaas-pd": {
                    "kind": "prfaas-pd",
                    "model": "internal-1t-hybrid",
                    "prfaas": {"hardware": "h200x8", "instances": 4},
                    "local": {"hardware": "h20x8", "instances": 8},
                    "link": {"bandwidth": "100Gbps"},
                }
            },
            "workload": {
                "lengths": {"kind": "lognormal", "mu": mu, "sigma": 1.0, "min": 128,
                            "max": "128K"},
                "output_tokens": 1024,
                "arrivals": {"process": "poisson", "load": 0.8},
            },
        }
    )  # fmt: skip


def _planner(mu: float, bandwidth: float = 100e9 / 8):
    sc = _scenario(mu)
    dep = sc.deployments["prfaas-pd"]
    inputs = PlanInputs(length_distribution(sc.workload.lengths), 1024, 1 / 40)

    def plan(n: int | None) -> StagePlan:
        return plan_deployment("prfaas-pd", dep, inputs, link_bytes_per_s=bandwidth, n_prefill=n)

    return plan


def test_long_prompts_need_more_prefill_after_sustained_checks() -> None:
    ctl = LongTermController(_planner(11.0), n_local=8, sustain=3)
    decisions = [ctl.update(1, HOT) for _ in range(3)]
    assert [d.act for d in decisions] == [False, False, True]
    assert decisions[-1].target_prefill == 5
    assert decisions[-1].gain > 0.3  # 1.97 vs 1.47 req/s in the planner


def test_no_conversion_without_pressure_on_the_growing_stage() -> None:
    ctl = LongTermController(_planner(11.0), n_local=8, sustain=1)
    d = ctl.update(1, StagePressure(prefill=0.2, decode=0.1))
    assert not d.act and "not under pressure" in d.reason
    assert ctl.update(1, HOT).act


def test_small_gains_do_not_move_the_split() -> None:
    ctl = LongTermController(_planner(9.9), n_local=8, sustain=1, min_gain=0.1)
    d = ctl.update(4, HOT)  # the optimum is 3/5, but 4/4 is within 3% of it
    assert d.target_prefill == 3 and not d.act and d.gain < 0.1


def test_optimal_split_resets_the_streak() -> None:
    ctl = LongTermController(_planner(11.0), n_local=8, sustain=2)
    assert not ctl.update(1, HOT).act
    assert ctl.update(5, HOT).reason == "split is optimal"
    assert not ctl.update(1, HOT).act  # streak starts over


def test_a_target_still_moving_the_same_way_keeps_the_streak() -> None:
    ctl = LongTermController(_planner(10.5), n_local=8, sustain=2)
    first = ctl.update(1, HOT)
    assert first.target_prefill == 4 and not first.act
    ctl.plan = _planner(11.0)  # the observed lengths keep growing
    second = ctl.update(1, HOT)
    assert second.act and second.target_prefill == 5


def test_narrow_link_moves_decode_to_prefill() -> None:
    ctl = LongTermController(_planner(9.9, bandwidth=5e9 / 8), n_local=8, sustain=1)
    d = ctl.update(3, HOT)
    assert d.act and d.target_prefill == 5


def test_shift_changes_lengths_and_rate_after_at_only() -> None:
    sc = _scenario(9.0)
    base = generate_requests(sc.workload, rate_rps=3.0, duration_s=300, seed=5)
    shifted_wl = sc.workload.model_copy(
        update={
            "shift": ShiftConfig(
                at=100.0,
                lengths=LognormalLengths(kind="lognormal", mu=11.0, sigma=1.0, min=128,
                                         max=131072),
                rate=1.5,
            )
        }
    )  # fmt: skip
    a = generate_requests(shifted_wl, rate_rps=3.0, duration_s=300, seed=5, shift_rate_rps=1.5)
    b = generate_requests(shifted_wl, rate_rps=3.0, duration_s=300, seed=5, shift_rate_rps=1.5)
    assert a == b
    before = [r for r in a if r.arrival < 100]
    after = [r for r in a if r.arrival >= 100]
    assert [r.arrival for r in before] == [r.arrival for r in base if r.arrival < 100]
    assert np.mean([r.input_tokens for r in after]) > 2.5 * np.mean(
        [r.input_tokens for r in before]
    )
    assert 1.2 < len(after) / 200 < 1.8


def test_shift_rejects_trace_replay() -> None:
    with pytest.raises(ValueError, match="shift works on generated workloads"):
        Scenario.model_validate(
            {
                **_scenario().model_dump(mode="json", exclude_none=True),
                "workload": {
                    "trace": "x.jsonl",
                    "arrivals": {"process": "trace"},
                    "shift": {"at": "10s", "lengths": {"kind": "fixed", "tokens": 100},
                              "rate": 1},
                },
            }
        )  # fmt: skip


async def test_pd_instance_switches_role_only_when_drained() -> None:
    spec = ServiceSpec(
        role="pd", id="local-decode-0", initial_role="decode", time_scale=100.0,
        byte_scale=1000.0, role_switch_s=5.0,
    )  # fmt: skip
    from aiohttp import web

    app, ports = await pd_app(spec)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    base = f"http://127.0.0.1:{runner.addresses[0][1]}"
    assert ports["kv"] > 0
    try:
        async with aiohttp.ClientSession() as s:
            async with s.get(f"{base}/role") as r:
                assert (await r.json())["role"] == "decode"
            # prefill work is refused while the instance decodes
            body = {"id": "x", "uncached_tokens": 100, "kv_host": "127.0.0.1", "kv_port": 1}
            async with s.post(f"{base}{PREFILL_PREFIX}/prefill", json=body) as r:
                assert r.status == 409
            # a decode waiting for KV keeps the instance busy: the switch is refused
            dbody = {"id": "d1", "output_tokens": 4, "expected_wire_bytes": 10}
            waiting = asyncio.create_task(s.post(f"{base}{DECODE_PREFIX}/decode", json=dbody))
            for _ in range(100):
                async with s.get(f"{base}{DECODE_PREFIX}/stats") as r:
                    if (await r.json())["waiting_kv"]:
                        break
                await asyncio.sleep(0.01)
            async with s.post(f"{base}/role", json={"role": "prefill"}) as r:
                assert r.status == 409 and "decode busy" in (await r.json())["error"]
            async with s.delete(f"{base}{DECODE_PREFIX}/decode/d1") as r:
                assert r.status == 200
            resp = await waiting
            await resp.read()
            resp.release()
            async with s.post(f"{base}/role", json={"role": "prefill"}) as r:
                doc = await r.json()
                assert r.status == 200 and doc["switched"] and doc["from"] == "decode"
            assert doc["ready"] - doc["started"] >= 5.0  # the switch costs role_switch_s
            async with s.post(f"{base}{DECODE_PREFIX}/decode", json=dbody) as r:
                assert r.status == 409
            async with s.post(f"{base}/role", json={"role": "sideways"}) as r:
                assert r.status == 400
    finally:
        await runner.cleanup()


def test_queue_balance_leans_away_from_the_backlogged_route_and_decays() -> None:
    from testbed.scheduler.balance import QueueBalance

    qb = QueueBalance(margin_s=2.0, step=1.1, max_bias=4.0)
    assert qb.update(3.0, 2.0) == 1.0  # within the margin: no move (hysteresis)
    for _ in range(100):
        qb.update(30.0, 1.0)  # the link/PrfaaS side is backlogged: raise t
    assert qb.bias == 4.0  # bounded
    held = qb.update(5.0, 4.0)  # balanced but both queued: hold what balances them
    assert held == 4.0
    for _ in range(100):
        qb.update(0.5, 0.2)  # both queues short: back to the planner's t
    assert qb.bias == 1.0
    for _ in range(3):
        qb.update(0.0, 10.0)  # PD-P backlogged: offload more
    assert qb.bias < 1.0
