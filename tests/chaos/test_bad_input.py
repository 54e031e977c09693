"""Bad API requests to the router, prefill and decode services: each gets a 4xx JSON error, and
the service keeps answering afterwards. In-process (aiohttp test server), so fast: no marker."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from testbed.services.spec import ServiceSpec

Factory = Callable[[ServiceSpec], Awaitable[tuple[web.Application, dict[str, int]]]]


def _factory(role: str) -> Factory:
    if role == "router":
        from testbed.services.router import create_app as router_app

        return router_app
    if role == "prefill":
        from testbed.services.prefill import create_app as prefill_app

        return prefill_app
    from testbed.services.decode import create_app as decode_app

    return decode_app


@pytest.fixture(params=["router", "prefill", "decode"])
async def service(request: pytest.FixtureRequest) -> AsyncIterator[tuple[str, TestClient]]:
    role: str = request.param
    spec = ServiceSpec(role=role, id=f"bad-{role}", hardware="h20x8", time_scale=1000)  # type: ignore[arg-type]
    app, _ = await _factory(role)(spec)
    client = TestClient(TestServer(app))
    await client.start_server()
    try:
        yield role, client
    finally:
        await client.close()


ENDPOINT = {"router": "/generate", "prefill": "/prefill", "decode": "/decode"}
VALID: dict[str, dict[str, Any]] = {
    "router": {"id": "x", "input_tokens": 100, "output_tokens": 4},
    "prefill": {"id": "x", "uncached_tokens": 100, "kv_host": "127.0.0.1", "kv_port": 9},
    "decode": {"id": "x", "output_tokens": 4, "expected_wire_bytes": 10},
}
# Field -> bad values, per role: wrong types, negative, zero, absurd, non-integral.
BAD_FIELDS: dict[str, dict[str, list[Any]]] = {
    "router": {
        "input_tokens": ["100", -5, 0, 10**13, 10**400, -(10**400), 1.5, None, [1], True, 1e308],
        "output_tokens": ["4", -1, 0, 10**9, 10**400, 2.5, {}, False, float("nan")],
        "id": [10**400, "", "x" * 61, ["a"]],
    },
    "prefill": {
        "uncached_tokens": ["abc", -5, 0, 10**13, 10**400, 1.5, None, [1], True],
        "kv_port": [-1, 0, 70000, "http", None, 1.5, 10**400, float("inf")],
        "kv_host": [None, 5, ["127.0.0.1"], ""],
        "id": ["", "x" * 65, None, {"a": 1}],
    },
    "decode": {
        "output_tokens": ["4x", -1, 0, 10**9, 10**400, 2.5, None],
        "expected_wire_bytes": [-1, "ten", None, 1.5, 10**16, 10**400, -(10**400)],
        "id": ["", "x" * 65, None, [1]],
    },
}


async def _expect_4xx_json(resp: Any) -> dict[str, Any]:
    assert 400 <= resp.status < 500, (resp.status, await resp.text())
    assert resp.content_type == "application/json", await resp.text()
    doc = await resp.json()
    assert "error" in doc
    return dict(doc)


async def _still_healthy(client: TestClient) -> None:
    resp = await client.get("/health")
    assert resp.status == 200


async def test_bad_fields_get_400_json(service: tuple[str, TestClient]) -> None:
    role, client = service
    for field, values in BAD_FIELDS[role].items():
        for value in values:
            body = {**VALID[role], field: value}
            text = json.dumps(body, allow_nan=True)
            resp = await client.post(
                ENDPOINT[role], data=text, headers={"Content-Type": "application/json"}
            )
            doc = await _expect_4xx_json(resp)
            assert doc["error"], (field, value)
    await _still_healthy(client)


DEEP = b"[" * 100_000 + b"]" * 100_000
"""Nesting no JSON parser recurses through: a RecursionError, not a 400, before the fix."""
DEEP_OBJECT = b'{"a":' * 100_000 + b"1" + b"}" * 100_000
LONG_INT = b'{"input_tokens": ' + b"9" * 5000 + b"}"
"""Past Python's 4300-digit int conversion limit: ValueError inside the JSON parser."""


@pytest.mark.parametrize(
    "payload",
    [
        b"",
        b"{",
        b"not json",
        b"[1, 2]",
        b'"string"',
        b"null",
        b"\xff\xfe",
        b"{}",
        DEEP,
        DEEP_OBJECT,
        LONG_INT,
        b'{"id": "\xc3\x28"}',
    ],
    ids=lambda p: p[:12].decode("latin-1") + (f"..{len(p)}" if len(p) > 12 else ""),
)
async def test_malformed_bodies_get_400_json(
    service: tuple[str, TestClient], payload: bytes
) -> None:
    role, client = service
    resp = await client.post(
        ENDPOINT[role], data=payload, headers={"Content-Type": "application/json"}
    )
    await _expect_4xx_json(resp)
    await _still_healthy(client)


async def test_oversized_body_gets_413_json(service: tuple[str, TestClient]) -> None:
    role, client = service
    big = json.dumps({**VALID[role], "pad": "x" * (2 << 20)})
    resp = await client.post(ENDPOINT[role], data=big, headers={"Content-Type": "application/json"})
    assert resp.status == 413
    await _expect_4xx_json(resp)
    await _still_healthy(client)


async def test_unknown_path_and_method_get_json(service: tuple[str, TestClient]) -> None:
    _, client = service
    await _expect_4xx_json(await client.get("/no/such/path"))
    await _expect_4xx_json(await client.put("/health"))
    await _still_healthy(client)


async def test_router_completions_bad_input() -> None:
    from testbed.services.router import create_app

    app, _ = await create_app(ServiceSpec(role="router", id="r"))
    async with TestClient(TestServer(app)) as client:
        for body in (
            {},
            {"prompt": "hi", "max_tokens": -3},
            {"prompt": "hi", "max_tokens": "many"},
            {"prompt": "hi", "input_tokens": 0},
            {"prompt": "x", "max_tokens": 10**9},
            {"prompt": "x", "max_tokens": 10**400},
            {"prompt": "x", "input_tokens": 10**400},
            {"prompt": "x", "max_tokens": 1e400},
        ):
            await _expect_4xx_json(await client.post("/v1/completions", json=body))
        await _still_healthy(client)
