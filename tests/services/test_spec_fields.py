"""What each service does with its ServiceSpec fields, in process where it can be: the engines'
timing and KV sizes, the decode batch, the clock, the prefill's KV connections, the decode's
KV deadline, the test-only breakages, the PD instance's first role, the router's engine
strategy, and the ports a started process binds. tests/test_no_silent_fields.py points here."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestClient, TestServer

from testbed.clock import LiveClock
from testbed.metrics.records import RequestRecord
from testbed.services.decode import DecodeState
from testbed.services.engines.emulated import EmulatedPrefill
from testbed.services.prefill import PrefillState
from testbed.services.router.engines import engine_requests
from testbed.services.spec import ServiceSpec
from testbed.transfer.receiver import KVReceiver

pytestmark = pytest.mark.timeout(60)


def spec(role: str = "prefill", **kw: Any) -> ServiceSpec:
    return ServiceSpec(role=role, id=f"{role}-0", **kw)  # type: ignore[arg-type]


def test_prefill_timing_and_kv_sizes_follow_model_hardware_and_byte_scale() -> None:
    def prefill(**kw: Any) -> EmulatedPrefill:
        s = spec(**kw)
        return EmulatedPrefill(s, LiveClock.of(s))

    h20, h200 = prefill(hardware="h20x8"), prefill(hardware="h200x8")
    assert h200.engine.duration(20_000) < h20.engine.duration(20_000)
    work = h20.parse({"uncached_tokens": 20_000})
    assert sum(prefill(byte_scale=2.0).layer_sizes(work)) < sum(h20.layer_sizes(work))
    kimi = prefill(model="kimi-linear-48b")
    assert kimi.layer_sizes(work) != h20.layer_sizes(work)


def test_decode_batch_follows_the_tpot_slo() -> None:
    tight = DecodeState(spec("decode", tpot_slo_s=0.025))
    loose = DecodeState(spec("decode", tpot_slo_s=0.1))
    assert loose.bs_max > tight.bs_max


def test_a_services_clock_is_its_runs_epoch_at_its_time_scale() -> None:
    clock = LiveClock.of(spec(t0=time.monotonic() - 10.0, time_scale=5.0))
    assert clock.time_scale == 5.0
    assert 50.0 <= clock.now() < 1e4  # 10 wall seconds since the epoch, 5x faster


def test_the_routers_engine_strategy_reads_engine_seeds_dtype_and_byte_scale() -> None:
    rec = RequestRecord(id="r1", input_tokens=64, output_tokens=4, arrival=0.0)
    emulated = engine_requests(spec("router"))
    assert emulated.prefix_cache and "tokens" not in emulated.prefill_fields(rec, 64, 64)
    halved = engine_requests(spec("router", byte_scale=2.0))
    assert halved.kv_wire_bytes(20_000, 20_000) < emulated.kv_wire_bytes(20_000, 20_000)
    torch = engine_requests(spec("router", engine="torch"))
    assert not torch.prefix_cache and len(torch.prefill_fields(rec, 64, 64)["tokens"]) == 64
    other = engine_requests(spec("router", engine="torch", prompt_seed=1))
    assert other.prefill_fields(rec, 64, 64) != torch.prefill_fields(rec, 64, 64)
    wide = engine_requests(spec("router", engine="torch", model_dtype="float64"))
    assert wide.kv_wire_bytes(64, 64) > torch.kv_wire_bytes(64, 64)


async def test_a_prefill_sends_kv_over_its_specs_connections() -> None:
    async with KVReceiver("127.0.0.1", 0) as receiver:
        state = PrefillState(spec(connections=3))
        try:
            sender = await state.sender(("127.0.0.1", receiver.port))
            assert sender.stats().connections == 3
        finally:
            for s in state.senders.values():
                await s.aclose()


@pytest.fixture
async def serve() -> AsyncIterator[Any]:
    """Serve a service's app in process; everything is closed at the end."""
    clients: list[TestClient] = []

    async def start(factory: Any, s: ServiceSpec) -> TestClient:
        app, _ = await factory(s)
        client = TestClient(TestServer(app))
        await client.start_server()
        clients.append(client)
        return client

    try:
        yield start
    finally:
        for c in clients:
            await c.close()


async def _lines(resp: aiohttp.ClientResponse) -> list[dict[str, Any]]:
    return [json.loads(line) async for line in resp.content if line.strip()]


async def test_a_decode_gives_up_on_kv_after_kv_timeout_s(serve: Any) -> None:
    from testbed.services.decode import create_app

    short = await serve(create_app, spec("decode", kv_timeout_s=0.2))
    long = await serve(create_app, spec("decode", kv_timeout_s=60.0))
    body = {"id": "x", "output_tokens": 2, "expected_wire_bytes": 10}
    async with asyncio.timeout(30):  # a hang is the bug: bounded, not a speed claim
        waiting = asyncio.create_task(long.post("/decode", json=body))
        lines = await _lines(await short.post("/decode", json=body))
        assert lines[0] == {"expecting": True} and "error" in lines[-1]
        stats = await (await long.get("/stats")).json()
        assert stats["waiting_kv"] == 1  # the other deadline has not passed
        waiting.cancel()


async def test_unsafe_skip_kv_verify_decodes_without_kv(serve: Any) -> None:
    from testbed.services.decode import create_app

    broken = await serve(create_app, spec("decode", unsafe_skip_kv_verify=True, time_scale=100))
    body = {"id": "x", "output_tokens": 2, "expected_wire_bytes": 10}
    async with asyncio.timeout(30):
        lines = await _lines(await broken.post("/decode", json=body))
    assert lines[1]["admitted"] is True and lines[1]["kv_verified"] is False
    assert lines[-1].get("done") is True


async def test_unsafe_fail_prefill_answers_every_prefill_with_an_error(serve: Any) -> None:
    from testbed.services.prefill import create_app

    body = {"id": "x", "uncached_tokens": 100, "kv_host": "127.0.0.1", "kv_port": 9}
    broken = await serve(create_app, spec(unsafe_fail_prefill=True, kv_targets=[("127.0.0.1", 9)]))
    resp = await broken.post("/prefill", json=body)
    assert resp.status == 502 and "unsafe_fail_prefill" in (await resp.json())["error"]
    stats = await (await broken.get("/stats")).json()
    assert stats["queued"] == 0 and not stats["running"]  # nothing was computed


async def test_a_pd_instance_serves_its_initial_role_first(serve: Any) -> None:
    from testbed.services.pd import create_app

    for role in ("prefill", "decode"):
        client = await serve(create_app, spec("pd", initial_role=role))
        assert (await (await client.get("/role")).json())["role"] == role


def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        port: int = s.getsockname()[1]
        return port


async def test_a_started_service_binds_its_specs_host_and_ports(tmp_path: Path) -> None:
    """host, port and kv_port are where it listens; its role is what it serves (a decode has a
    KV port, a prefill none); its id names its log."""
    from testbed.substrate.local import start_service, stop_services

    host = "127.0.0.2"
    http, kv = _free_port(host), _free_port(host)
    svc = await start_service(spec("decode", host=host, port=http, kv_port=kv), tmp_path)
    other = await start_service(spec("prefill", host=host), tmp_path)
    try:
        assert svc.ports == {"http": http, "kv": kv} and svc.url == f"http://{host}:{http}"
        async with aiohttp.ClientSession() as s, s.get(f"{svc.url}/health") as r:
            assert r.status == 200
        with socket.create_connection((host, kv), timeout=5):
            pass  # the KV receiver listens there too
        assert "kv" not in other.ports
        assert (tmp_path / "decode-0.log").exists() and (tmp_path / "prefill-0.log").exists()
    finally:
        await stop_services([svc, other])


def test_the_cluster_is_the_network_a_container_joins() -> None:
    from testbed.substrate.compose.service_doc import service_doc as _service_doc

    doc = _service_doc(spec(cluster="prfaas"), "10.1.0.5")
    assert (
        doc["networks"]["prfaas"] == {"ipv4_address": "10.1.0.5"} and "local" not in doc["networks"]
    )
    assert "local" in _service_doc(spec(cluster="local"), "10.2.0.5")["networks"]
