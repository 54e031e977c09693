"""The `vllm` flavour of the router-facing API (services.facade) against what vllm-router 0.1.17
really sent (fixtures/vllm-router-0.1.17, recorded as fixtures/README.md says): each recorded
prefill request is prefilled and answered with one token and kv_transfer_params naming the
prefill and its KV handle; the recorded decode request, carrying those (as the router copies
them), pulls the held KV as real bytes, verifies it and decodes. A KV no decode pulls is
released; a pull the prefill cannot serve is a 503 from the decode half, never a failure inside
a 200 stream. In-process, loopback, fast."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from testbed.services.decode import STATE as DECODE_STATE
from testbed.services.facade.render import token_ids
from testbed.services.facade.rooms import FACADE as PREFILL_FACADE
from testbed.services.tokenizer import codec
from tests.services.facade.fleet import SCALE, Fleet, attempts, hold_prefills, make_fleet
from tests.services.facade.fleet import fixture as _fixture


def fixture(name: str) -> dict[str, Any]:
    return _fixture("vllm-router-0.1.17", name)


@pytest.fixture
async def fleet() -> AsyncIterator[Fleet]:
    async for f in make_fleet("vllm"):
        yield f


@pytest.fixture
async def short_fleet() -> AsyncIterator[Fleet]:
    async for f in make_fleet("vllm", kv_timeout_s=1.0):
        yield f


def _pairs(doc: dict[str, Any]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """The recorded (prefill request, decode request) of each router request, in order, joined
    by the router's X-Request-Id."""
    by_id: dict[str, dict[str, dict[str, Any]]] = {}
    for r in doc["requests"]:
        rid = r["headers"].get("x-request-id")
        if r["method"] == "POST" and rid is not None:
            by_id.setdefault(rid, {})[r["worker"].split("-")[0]] = r
    return [(h["prefill"], h["decode"]) for h in by_id.values() if len(h) == 2]


async def _router(fleet: Fleet, p: dict[str, Any], d: dict[str, Any], i: int) -> tuple[Any, ...]:
    """One recorded request as vllm-router sends it: the prefill, then the decode with the
    prefill answer's kv_transfer_params copied in."""
    pc, dc = fleet.prefill[i % 2], fleet.decode[i % 2]
    headers = {"X-Request-Id": p["headers"]["x-request-id"]}
    pr = await pc.post(p["path"], json=p["body"], headers=headers)
    pdoc = await pr.json()
    assert pr.status == 200, pdoc
    body = {**d["body"], "kv_transfer_params": pdoc["kv_transfer_params"]}
    dr = await dc.post(d["path"], json=body, headers=headers)
    return pdoc, dr, await dr.read(), body


def test_the_recording_shows_a_sequential_handoff() -> None:
    """What this flavour is built on, as recorded: the prefill is asked for one token with
    do_remote_decode, the decode after the prefill answered, with its kv_transfer_params
    copied verbatim; a prefill 503 is the client's 500, never retried, the decode not asked."""
    doc = fixture("round_robin")
    pairs = _pairs(doc)
    assert len(pairs) == 4
    for p, d in pairs:
        assert p["body"]["max_tokens"] == 1 and p["body"]["min_tokens"] == 1
        assert p["body"]["stream"] is False and "stream_options" not in p["body"]
        assert p["body"]["kv_transfer_params"]["do_remote_decode"] is True
        assert d["t_ms"] >= p["t_ms"] + 50  # the fake prefill answers after 50 ms
        port = int(p["headers"]["x-request-id"].split("prefill_addr_127.0.0.1:")[1][:5])
        assert d["body"]["kv_transfer_params"]["remote_engine_id"] == f"engine-{port}"
        assert d["body"]["testbed_request_id"] == p["body"]["testbed_request_id"]
    failed = fixture("prefill_503_not_retried")
    posts = [r for r in failed["requests"] if r["method"] == "POST"]
    assert [r["worker"].split("-")[0] for r in posts[:2]] == ["prefill", "prefill"]
    assert failed["client"]["completions"]["status"] == 500
    assert "returned 503" in failed["client"]["completions"]["body"]


@pytest.mark.parametrize("case", ["round_robin", "cache_aware"])
async def test_recorded_requests_are_prefilled_held_pulled_verified_and_decoded(
    fleet: Fleet, case: str
) -> None:
    pairs = _pairs(fixture(case))
    assert len(pairs) == 4  # completions, completions stream, chat, chat stream
    async with asyncio.timeout(60):
        results = [await _router(fleet, p, d, i) for i, (p, d) in enumerate(pairs)]
    for pdoc, dr, dbody, body in results:
        params = pdoc["kv_transfer_params"]
        assert params["remote_engine_id"].startswith("prfaas-prefill-")
        assert params["do_remote_prefill"] is True and len(params["remote_block_ids"]) == 1
        assert pdoc["usage"]["completion_tokens"] == 1
        assert pdoc["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
        assert dr.status == 200, dbody
        want = body.get("max_completion_tokens", body.get("max_tokens"))
        if body["stream"]:
            events = [e for e in dbody.decode().split("\n\n") if e]
            assert events[-1] == "data: [DONE]"
            chunks = [json.loads(e[6:]) for e in events[:-1]]
            if body.get("stream_options", {}).get("include_usage"):
                assert chunks[-1]["usage"]["completion_tokens"] == want
        else:
            assert json.loads(dbody)["usage"]["completion_tokens"] == want
    done = [a for c in fleet.decode for a in await attempts(c)]
    assert [a["outcome"] for a in done] == ["completed"] * 4
    for a in done:
        assert a["kv_verified"] is True
        assert a["kv_wire_bytes_expected"] == a["kv_wire_bytes_sent"] == a["kv_wire_bytes_received"]
        assert a["kv_wire_bytes_received"] > 0
        assert a["route"] == "prfaas" and a["prefill_instance"].startswith("prfaas-prefill-")
        assert a["router_id"].startswith("___prefill_addr_")
        # the pull starts after the prefill ended: no layer-wise overlap in this flavour
        assert a["transfer_start"] >= a["prefill_end"]
    held = [a for c in fleet.prefill for a in await attempts(c)]
    assert {a["room"] for a in held} == {a["room"] for a in done}
    assert {a["outcome"] for a in held} == {"completed"}
    # vllm-router passes the load generator's field on chat too (SGLang's gateway drops it)
    assert {a["request"] for a in done} == {"r-0", "r-1", "r-2", "r-3"}
    for c in fleet.prefill:  # every handle pulled and forgotten
        assert not c.server.app[PREFILL_FACADE].rooms.rooms


async def test_cache_aware_renders_count_the_prompt_without_tokenizing(fleet: Fleet) -> None:
    """Each recorded render (and the /tokenize fallback) is answered on a prefill and a decode
    worker; a body with input_tokens is counted from it, others by the shipped tokenizer; equal
    hash ids give equal ids block by block."""
    renders = [r for r in fixture("cache_aware")["requests"] if r["path"].endswith("/render")]
    tokenizes = [
        r for r in fixture("cache_aware_tokenize_fallback")["requests"] if r["path"] == "/tokenize"
    ]
    assert len(renders) == 16 and len(tokenizes) == 16  # 4 requests x 4 workers
    text = codec().encode("hello world this is a prompt")
    for r in renders + tokenizes:
        c = (fleet.prefill if r["worker"].startswith("prefill") else fleet.decode)[0]
        resp = await c.post(r["path"], json=r["body"])
        assert resp.status == 200, (r["path"], await resp.text())
        doc = await resp.json()
        if r["path"] == "/tokenize":
            assert doc["count"] == len(doc["tokens"])
            continue
        ids = (doc[0] if isinstance(doc, list) else doc)["token_ids"]
        if "input_tokens" in r["body"]:
            assert len(ids) == r["body"]["input_tokens"]
        elif "prompt" in r["body"]:
            assert len(ids) == len(text)
    a, b = token_ids(1200, (7, 8), 1), token_ids(1200, (7, 9), 2)
    assert len(a) == 1200 and a[:512] == b[:512] and a[512:1024] != b[512:1024]
    body = {"model": "m", "prompt": "x", "input_tokens": 1200, "hash_ids": [7, 8]}
    resp = await fleet.decode[1].post("/v1/completions/render", json=body)
    assert (await resp.json())[0]["token_ids"][:1024] == a[:1024]


async def test_registration_metrics_and_load_are_in_vllms_shapes(fleet: Fleet) -> None:
    doc = fixture("round_robin")
    gets = {r["path"] for r in doc["requests"] if r["method"] == "GET"}
    assert gets == {"/health", "/metrics"}
    for c in (*fleet.prefill, *fleet.decode):
        assert (await c.get("/health")).status == 200
        text = await (await c.get("/metrics")).text()
        vllm = [line for line in text.splitlines() if line.startswith("vllm:")]
        assert vllm and all('engine="0"' in line for line in vllm)
        assert await (await c.get("/get_load")).json() == {"load": 0}
    polled = {r["path"] for r in fixture("power_of_two")["requests"] if r["method"] == "GET"}
    assert "/get_load" in polled


async def test_requests_without_the_handshake_are_refused_in_openai_shape(fleet: Fleet) -> None:
    _, d = _pairs(fixture("round_robin"))[0]
    plain = {k: v for k, v in d["body"].items() if k != "kv_transfer_params"}
    for c in (fleet.prefill[0], fleet.decode[0]):
        resp = await c.post("/v1/completions", json=plain)
        assert resp.status == 400
        assert "kv_transfer_params" in (await resp.json())["error"]["message"]


def _decode_body(handle: int, port: int, engine: str = "prfaas-prefill-0") -> dict[str, Any]:
    _, d = _pairs(fixture("round_robin"))[0]
    params = {
        "do_remote_prefill": True,
        "do_remote_decode": False,
        "remote_engine_id": engine,
        "remote_block_ids": [handle],
        "remote_host": "127.0.0.1",
        "remote_port": port,
    }
    return {**d["body"], "kv_transfer_params": params}


async def test_a_pull_the_prefill_cannot_serve_is_a_503_at_once(fleet: Fleet) -> None:
    """A handle the prefill does not hold, the wrong engine, or nothing listening: a 503 with
    the reason before any KV wait (the KV timeout is 30 s here: a hang would be the bug)."""
    port = fleet.prefill[0].server.port
    assert port is not None
    server = await asyncio.start_server(lambda r, w: w.close(), "127.0.0.1", 0)
    dead = server.sockets[0].getsockname()[1]
    server.close()
    await server.wait_closed()
    cases = [
        (_decode_body(11, port), "holds no KV under handle 11"),
        (_decode_body(12, port, engine="prfaas-prefill-1"), "not engine prfaas-prefill-1"),
        (_decode_body(13, dead), "bootstrap"),
    ]
    async with asyncio.timeout(20):
        for body, why in cases:
            resp = await fleet.decode[0].post("/v1/completions", json=body)
            assert resp.status == 503
            assert why in (await resp.json())["error"]["message"]
    assert [a["outcome"] for a in await attempts(fleet.decode[0])] == ["failed"] * 3
    state = fleet.decode[0].server.app[DECODE_STATE]
    assert state.waiting_kv == 0 and state.receiver.stats().requests_tracked == 0


async def test_a_held_kv_no_decode_pulls_is_released(short_fleet: Fleet) -> None:
    """The router never asks a decode (it died, or the client left): the prefill's KV is held
    for the instance's KV timeout (1 s here), then released and journaled; a late pull is a
    503 at once."""
    p, _ = _pairs(fixture("round_robin"))[0]
    pc = short_fleet.prefill[0]
    async with asyncio.timeout(20):
        answer = await (await pc.post(p["path"], json=p["body"])).json()
        while not await attempts(pc):
            await asyncio.sleep(0.1)
        (held,) = await attempts(pc)
        assert held["outcome"] == "released" and "no decode pulled" in held["reason"]
        params = answer["kv_transfer_params"]
        body = _decode_body(params["remote_block_ids"][0], params["remote_port"])
        resp = await short_fleet.decode[0].post("/v1/completions", json=body)
    assert resp.status == 503
    assert "holds no KV" in (await resp.json())["error"]["message"]


async def test_a_prefill_the_router_closes_is_released(
    fleet: Fleet, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The router goes away while the prompt is computed: the job is cancelled and the attempt
    journaled as released; the handle was never published."""
    pc = fleet.prefill[0]
    hold_prefills(pc, monkeypatch)  # running until cancelled, whatever the machine's load
    p, _ = _pairs(fixture("round_robin"))[0]
    body = p["body"]
    prefill = asyncio.ensure_future(pc.post("/v1/completions", json=body))
    async with asyncio.timeout(20):
        while not (await (await pc.get("/stats")).json())["running"]:
            assert not prefill.done()
            await asyncio.sleep(0.02)
        prefill.cancel()
        while not await attempts(pc):
            await asyncio.sleep(0.05)
    (attempt,) = await attempts(pc)
    assert attempt["outcome"] == "released" and "router closed" in attempt["reason"]


async def test_a_prefill_attempt_arrives_before_its_prompt_is_sized(
    fleet: Fleet, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The prefill's record counts from the request's arrival, tokenizing included."""
    from testbed.services.facade import vllm_prefill

    parse = vllm_prefill.parse_request

    async def slow(*args: Any, **kwargs: Any) -> Any:
        await asyncio.sleep(0.02)  # a long text prompt in the tokenizer pool
        return await parse(*args, **kwargs)

    monkeypatch.setattr(vllm_prefill, "parse_request", slow)
    p, d = _pairs(fixture("round_robin"))[0]
    async with asyncio.timeout(60):
        await _router(fleet, p, d, 0)
    (pre,) = [a for c in fleet.prefill for a in await attempts(c)]
    assert pre["prefill_start"] - pre["arrival"] >= 0.02 * SCALE["time_scale"]
