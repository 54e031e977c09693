"""The `sglang` flavour of the router-facing API (services.facade) against what sglang-router
0.3.2 really sent (fixtures/, recorded as fixtures/README.md says): the recorded bodies, replayed
to both halves at once as the gateway sends them, are prefilled, moved as real KV bytes,
verified and decoded; a prefill that fails, dies or never comes is a 503 from the decode half
(which the gateway retries), never a failure inside a 200 stream; an abandoned half is released.
In-process, loopback, fast."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from testbed.services.decode import STATE as DECODE_STATE
from testbed.services.decode import create_app as decode_app
from testbed.services.facade.text import tokenizer_dir
from testbed.services.kv_targets import kv_address
from testbed.services.spec import InstanceInfo, ServiceSpec
from tests.services.facade.fleet import SCALE, Fleet, hold_prefills, make_fleet, server
from tests.services.facade.fleet import attempts as _attempts
from tests.services.facade.fleet import fixture as _fixture


def fixture(name: str) -> dict[str, Any]:
    return _fixture("sglang-router-0.3.2", name)


@pytest.fixture
async def fleet() -> AsyncIterator[Fleet]:
    async for f in make_fleet("sglang"):
        yield f


@pytest.fixture
async def short_fleet() -> AsyncIterator[Fleet]:
    async for f in make_fleet("sglang", kv_timeout_s=1.0):
        yield f


def _pairs(doc: dict[str, Any]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """The recorded (prefill request, decode request) of each room, in order."""
    by_room: dict[int, dict[str, dict[str, Any]]] = {}
    for r in doc["requests"]:
        if r["method"] == "POST" and isinstance(r["body"], dict) and "bootstrap_room" in r["body"]:
            by_room.setdefault(r["body"]["bootstrap_room"], {})[r["worker"]] = r
    out = []
    for halves in by_room.values():
        p = next(v for k, v in halves.items() if k.startswith("prefill"))
        d = next(v for k, v in halves.items() if k.startswith("decode"))
        out.append((p, d))
    return out


async def _gateway(fleet: Fleet, p: dict[str, Any], d: dict[str, Any], i: int) -> tuple[Any, ...]:
    """Send one recorded pair as the gateway does: both halves at once, the bootstrap address
    the prefill worker's."""
    pc, dc = fleet.prefill[i % 2], fleet.decode[i % 2]
    assert pc.server.port is not None
    body = {**d["body"], "bootstrap_port": pc.server.port}
    pbody = {**p["body"], "bootstrap_port": pc.server.port}
    assert body == pbody  # the gateway sends one body to both halves
    pr, dr = await asyncio.gather(pc.post(p["path"], json=pbody), dc.post(d["path"], json=body))
    return pr, await pr.read(), dr, await dr.read(), body


@pytest.mark.parametrize("case", ["round_robin", "cache_aware"])
async def test_recorded_requests_are_prefilled_moved_verified_and_decoded(
    fleet: Fleet, case: str
) -> None:
    pairs = _pairs(fixture(case))
    assert len(pairs) == 4  # completions, completions stream, chat, chat stream
    async with asyncio.timeout(60):
        results = [await _gateway(fleet, p, d, i) for i, (p, d) in enumerate(pairs)]
    for pr, _pbody, dr, dbody, body in results:
        assert pr.status == 200 and dr.status == 200, dbody
        want = body.get("max_completion_tokens", body.get("max_tokens"))
        if body["stream"]:
            assert dr.headers["Content-Type"].startswith("text/event-stream")
            events = [e for e in dbody.decode().split("\n\n") if e]
            assert events[-1] == "data: [DONE]"
            chunks = [json.loads(e[6:]) for e in events[:-1]]
            if body.get("stream_options", {}).get("include_usage"):
                assert chunks[-1]["usage"]["completion_tokens"] == want
        else:
            doc = json.loads(dbody)
            assert doc["usage"]["completion_tokens"] == want
            assert doc["choices"][0]["finish_reason"] == "length"
    done = [a for c in fleet.decode for a in await _attempts(c)]
    assert [a["outcome"] for a in done] == ["completed"] * 4
    # each journaled its verified KV before it answered (a worker dying mid-stream keeps it)
    seen = [(a["outcome"], a["room"]) for c in fleet.decode for a in await _attempts(c, True)]
    assert sorted(seen) == sorted(
        [("verified", a["room"]) for a in done] + [("completed", a["room"]) for a in done]
    )
    for a in done:
        assert a["kv_verified"] is True
        assert a["kv_wire_bytes_expected"] == a["kv_wire_bytes_sent"] == a["kv_wire_bytes_received"]
        assert a["kv_wire_bytes_received"] > 0
        assert a["route"] == "prfaas" and a["prefill_instance"].startswith("prfaas-prefill-")
    rooms = {a["room"] for c in fleet.prefill for a in await _attempts(c)}
    assert rooms == {a["room"] for a in done}
    # the load generator's field passes completions (the gateway drops it from chat)
    assert {a["request"] for a in done} == {"r-0", "r-1", None}


async def test_input_tokens_size_the_prompt_without_tokenizing(fleet: Fleet) -> None:
    p, d = _pairs(fixture("round_robin"))[0]
    body = {**d["body"], "prompt": "x", "input_tokens": 2000, "hash_ids": [1, 2, 3, 4]}
    async with asyncio.timeout(60):
        _, _, dr, dbody, _ = await _gateway(fleet, {**p, "body": body}, {**d, "body": body}, 0)
    assert dr.status == 200
    assert json.loads(dbody)["usage"]["prompt_tokens"] == 2000


async def test_registration_requests_are_answered(fleet: Fleet) -> None:
    doc = fixture("round_robin")
    gets = {(r["worker"], r["path"]) for r in doc["requests"] if r["method"] == "GET"}
    assert {p for _, p in gets} == {"/health", "/server_info", "/model_info"}
    for worker, path in sorted(gets):
        group = fleet.prefill if worker.startswith("prefill") else fleet.decode
        resp = await group[int(worker[-1])].get(path)
        assert resp.status == 200, (worker, path)
        if path != "/health":
            assert (await resp.json())["model_path"] == str(tokenizer_dir())
    load = await (await fleet.prefill[0].get("/get_load")).json()
    assert isinstance(load, list) and load[0]["num_tokens"] == 0


async def test_a_request_without_a_room_is_refused_in_openai_shape(fleet: Fleet) -> None:
    resp = await fleet.decode[0].post("/v1/completions", json={"prompt": "hi", "max_tokens": 2})
    assert resp.status == 400
    assert "bootstrap" in (await resp.json())["error"]["message"]


async def _decode_only(fleet: Fleet, bootstrap_port: int, room: int) -> Any:
    _, d = _pairs(fixture("round_robin"))[0]
    body = {**d["body"], "bootstrap_port": bootstrap_port, "bootstrap_room": room}
    return await fleet.decode[0].post("/v1/completions", json=body)


async def test_a_dead_prefill_is_a_503_at_once(fleet: Fleet) -> None:
    """Nothing listens at the bootstrap address: the decode half says so before any KV wait
    (the gateway retries a 503, tests/services/facade/fixtures/decode_503_retried.json)."""
    server = await asyncio.start_server(lambda r, w: w.close(), "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    server.close()
    await server.wait_closed()
    async with asyncio.timeout(20):  # the KV timeout is 30 s: a hang would be the bug
        resp = await _decode_only(fleet, port, 11)
    assert resp.status == 503
    assert "bootstrap" in (await resp.json())["error"]["message"]
    (attempt,) = await _attempts(fleet.decode[0])
    assert attempt["outcome"] == "failed"
    assert fleet.decode[0].server.app[DECODE_STATE].receiver.stats().requests_tracked == 0


async def test_a_kv_timeout_is_a_503_not_a_broken_stream(short_fleet: Fleet) -> None:
    """The room's prefill request never comes: the decode half's KV wait times out (1 s here)
    and it answers 503 with the reason, its status line held until then."""
    port = short_fleet.prefill[0].server.port
    assert port is not None
    async with asyncio.timeout(20):
        resp = await _decode_only(short_fleet, port, 12)
    assert resp.status == 503
    assert "timed out" in (await resp.json())["error"]["message"]
    state = short_fleet.decode[0].server.app[DECODE_STATE]
    assert state.waiting_kv == 0 and state.receiver.stats().requests_tracked == 0


async def test_a_failed_prefill_releases_its_decode_half_at_once(
    fleet: Fleet, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The gateway closes the prefill request (a retry, a client gone): the prefill half ends
    the room, and the decode half learns it through its bootstrap poll: a 503 at once."""
    pc = fleet.prefill[0]
    assert pc.server.port is not None
    hold_prefills(pc, monkeypatch)  # running until cancelled, whatever the machine's load
    p, _ = _pairs(fixture("round_robin"))[0]
    body = {**p["body"], "bootstrap_port": pc.server.port, "bootstrap_room": 13}
    prefill = asyncio.ensure_future(pc.post("/v1/completions", json=body))
    decode = asyncio.ensure_future(fleet.decode[0].post("/v1/completions", json=body))
    async with asyncio.timeout(20):
        while not (await (await pc.get("/stats")).json())["running"]:
            assert not prefill.done()
            await asyncio.sleep(0.02)
        prefill.cancel()
        resp = await decode
    assert resp.status == 503
    (attempt,) = await _attempts(pc)
    assert attempt["outcome"] == "released"


async def test_an_abandoned_decode_half_is_released(fleet: Fleet) -> None:
    """The gateway goes away while the decode half waits for its KV: the handler is cancelled,
    the receiver's entry freed, the attempt journaled as released."""
    port = fleet.prefill[0].server.port
    assert port is not None
    state = fleet.decode[0].server.app[DECODE_STATE]
    task = asyncio.ensure_future(_decode_only(fleet, port, 14))
    async with asyncio.timeout(20):
        while state.waiting_kv == 0:
            await asyncio.sleep(0.01)
        task.cancel()
        while not await _attempts(fleet.decode[0]):
            await asyncio.sleep(0.05)
    (attempt,) = await _attempts(fleet.decode[0])
    assert attempt["outcome"] == "released"
    assert state.waiting_kv == 0 and state.receiver.stats().requests_tracked == 0


async def test_without_a_facade_a_worker_serves_only_our_routers_api() -> None:
    spec = ServiceSpec(role="decode", id="d", **SCALE)
    app, _ = await decode_app(spec)
    async with TestClient(server(app)) as client:
        assert (await client.post("/v1/completions", json={})).status in (404, 405)
        assert (await client.get("/server_info")).status == 404


def test_the_kv_crosses_the_link_only_between_clusters() -> None:
    d = InstanceInfo(id="d", cluster="local", role="decode", url="-", kv_host="h", kv_port=1,
                     kv_link_host="link", kv_link_port=2)  # fmt: skip
    assert kv_address("prfaas", d) == ("link", 2)
    assert kv_address("local", d) == ("h", 1)
    assert kv_address("prfaas", d.model_copy(update={"kv_link_port": None})) is None


async def test_only_the_deployments_decode_instances_may_register(fleet: Fleet) -> None:
    body = {"wire_id": "w" * 24, "decode": "someone-else", "expected_wire_bytes": 10}
    resp = await fleet.prefill[0].post("/bootstrap/15", json=body)
    assert resp.status == 403


SIZING_S = 0.02
"""Wall seconds a test makes prompt sizing take (4 real-world seconds at SCALE's time_scale)."""


def _slow_sizing(monkeypatch: pytest.MonkeyPatch, module: Any) -> None:
    parse = module.parse_request

    async def slow(*args: Any, **kwargs: Any) -> Any:
        await asyncio.sleep(SIZING_S)  # a long text prompt in the tokenizer pool
        return await parse(*args, **kwargs)

    monkeypatch.setattr(module, "parse_request", slow)


async def test_an_attempt_arrives_before_its_prompt_is_sized(
    fleet: Fleet, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server's TTFT counts from the request's arrival, tokenizing included (an outside
    client's record is built from these times: `testbed up --router`)."""
    from testbed.services.facade import decode_half, sglang_prefill

    _slow_sizing(monkeypatch, decode_half)
    _slow_sizing(monkeypatch, sglang_prefill)
    p, d = _pairs(fixture("round_robin"))[0]
    async with asyncio.timeout(60):
        _, _, dr, dbody, _ = await _gateway(fleet, p, d, 0)
    assert dr.status == 200, dbody
    sized = SIZING_S * SCALE["time_scale"]
    (dec,) = [a for c in fleet.decode for a in await _attempts(c)]
    (pre,) = [a for c in fleet.prefill for a in await _attempts(c)]
    assert dec["first_token"] - dec["arrival"] >= sized
    assert pre["prefill_start"] - pre["arrival"] >= sized
