"""A string that is not valid Unicode (a lone UTF-16 surrogate, `"\\ud800"` in JSON) is a 400
everywhere a JSON string is read, never a 500 with a traceback (issue #33, defect 3): the
router's /generate id, /v1/completions prompt and chat content, the prefill's /prefill id, the
decode's /decode id, and the link API, where an accepted proxy name made every later
`GET /metrics` a 500. In-process (aiohttp test server), so fast: no marker."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from testbed.link.api import build_app
from testbed.link.emulator import LinkEmulator
from testbed.link.jsonbody import JsonBodyError, decode, lone_surrogate
from testbed.services.spec import ServiceSpec
from testbed.services.validate import BadRequest, parse_json_object, str_field

LONE = "x\ud800"
PAIR = "\U0001f600"  # an emoji: a surrogate *pair* in JSON escapes, valid Unicode


async def _app(role: str) -> web.Application:
    spec = ServiceSpec(role=role, id=f"u-{role}", hardware="h20x8", time_scale=1000)  # type: ignore[arg-type]
    if role == "router":
        from testbed.services.router import create_app
    elif role == "prefill":
        from testbed.services.prefill import create_app
    else:
        from testbed.services.decode import create_app
    app, _ = await create_app(spec)
    return app


@pytest.fixture
async def clients() -> AsyncIterator[dict[str, TestClient]]:
    out: dict[str, TestClient] = {}
    try:
        for role in ("router", "prefill", "decode"):
            out[role] = TestClient(TestServer(await _app(role)))
            await out[role].start_server()
        yield out
    finally:
        for c in out.values():
            await c.close()


CASES: list[tuple[str, str, dict[str, Any]]] = [
    ("router", "/generate", {"id": LONE, "input_tokens": 100, "output_tokens": 4}),
    ("router", "/v1/completions", {"prompt": LONE, "max_tokens": 2}),
    ("router", "/v1/completions", {"prompt": [LONE], "max_tokens": 2}),
    (
        "router",
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": LONE}], "max_tokens": 2},
    ),
    (
        "router",
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": [{"type": "text", "text": LONE}]}]},
    ),
    (
        "prefill",
        "/prefill",
        {"id": LONE, "uncached_tokens": 100, "kv_host": "127.0.0.1", "kv_port": 9},
    ),
    ("decode", "/decode", {"id": LONE, "output_tokens": 4, "expected_wire_bytes": 10}),
]


@pytest.mark.parametrize(("role", "path", "body"), CASES, ids=[f"{c[0]}{c[1]}" for c in CASES])
async def test_a_lone_surrogate_is_a_400_on_every_path(
    clients: dict[str, TestClient],
    role: str,
    path: str,
    body: dict[str, Any],
    caplog: pytest.LogCaptureFixture,
) -> None:
    raw = json.dumps(body)  # ensure_ascii: the surrogate goes as the escape "\ud800"
    assert "\\ud800" in raw
    with caplog.at_level(logging.INFO):
        resp = await clients[role].post(
            path, data=raw, headers={"Content-Type": "application/json"}
        )
        text = await resp.text()
    assert resp.status == 400, text
    assert "not valid Unicode" in text
    assert not [r for r in caplog.records if r.exc_info], "a traceback was logged"
    # the service still answers afterwards
    health = await clients[role].get("/health")
    assert health.status == 200


async def test_a_surrogate_pair_is_valid_text(clients: dict[str, TestClient]) -> None:
    body = {"id": PAIR, "output_tokens": 4, "expected_wire_bytes": 10}
    raw = json.dumps(body)
    assert "\\ud83d\\ude00" in raw
    assert parse_json_object(raw.encode()) == body
    resp = await clients["decode"].post("/decode", data=raw)
    assert resp.status != 400 or "Unicode" not in await resp.text()


def test_str_field_refuses_a_lone_surrogate_built_in_code() -> None:
    with pytest.raises(BadRequest):
        str_field({"id": LONE}, "id", 64)
    assert str_field({"id": PAIR}, "id", 64) == PAIR


def test_the_check_sees_keys_and_nested_strings() -> None:
    assert lone_surrogate({LONE: 1})
    assert lone_surrogate({"a": [{"b": ["\udfff"]}]})
    assert not lone_surrogate({"a": [PAIR, 1, None]})
    # the pre-filter: a body with no surrogate escape is not re-encoded at all
    assert not lone_surrogate({"a": LONE}, text='{"a": "no escape here"}')
    with pytest.raises(JsonBodyError, match="not valid Unicode"):
        decode(json.dumps({"name": LONE}))


async def test_the_link_api_refuses_a_lone_surrogate_and_metrics_stay_up() -> None:
    emulator = LinkEmulator()
    client = TestClient(TestServer(build_app(emulator)))
    await client.start_server()
    try:
        raw = json.dumps({"name": LONE, "listen": "127.0.0.1:0", "upstream": "127.0.0.1:9"})
        resp = await client.post("/proxies", data=raw)
        assert resp.status == 400, await resp.text()
        assert "not valid Unicode" in (await resp.json())["error"]
        assert not emulator.proxies
        metrics = await client.get("/metrics")
        assert metrics.status == 200, await metrics.text()
        ok = json.dumps({"name": "fine", "listen": "127.0.0.1:0", "upstream": "127.0.0.1:9"})
        assert (await client.post("/proxies", data=ok)).status == 201
    finally:
        await client.close()
        await emulator.close()
