"""OpenAI fields are checked as vLLM checks them, on both OpenAI fronts (issue #33, defect 7):
`n` and `best_of` other than 1 are 400s naming the field (each front makes one choice), a
`stream` or `stream_options.include_usage` that is not a boolean is a 400 (`"false"` used to
stream), and `model` must be a short string: a dict used to be echoed as its repr and a 900 KiB
name in every chunk. The router answers a model it does not serve with vLLM's 404; the
router-facing API takes any short name, as the gateway forwards its client's (its recorded
bodies still parse). In-process, loopback, fast."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from testbed.services.facade.openai import parse_request
from testbed.services.router import create_app
from testbed.services.router.intake import STATE
from testbed.services.spec import ServiceSpec

FIXTURES = Path(__file__).parent / "facade" / "fixtures" / "sglang-router-0.3.2"
MODEL = ServiceSpec(role="router", id="r").model

BAD: list[tuple[dict[str, Any], str]] = [
    ({"n": 3}, "n must be 1"),
    ({"n": "1"}, "n must be 1"),
    ({"best_of": 2}, "best_of must be 1"),
    ({"stream": "false"}, "stream must be a boolean"),
    ({"stream": 1}, "stream must be a boolean"),
    ({"stream": True, "stream_options": "usage"}, "stream_options must be an object"),
    ({"stream": True, "stream_options": {"include_usage": "yes"}}, "include_usage"),
    ({"model": {"a": [1]}}, "model must be a string"),
    ({"model": "m" * (900 << 10)}, "model must be a string"),
]


@pytest.fixture
async def router() -> AsyncIterator[TestClient]:
    app, _ = await create_app(ServiceSpec(role="router", id="r", time_scale=1000))
    app[STATE].no_route_wait_s = 0.0  # no instances: a request that passes fails at once
    client = TestClient(TestServer(app, host="127.0.0.1"))
    await client.start_server()
    try:
        yield client
    finally:
        await client.close()


@pytest.mark.parametrize(("extra", "reason"), BAD, ids=[r for _, r in BAD])
@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
async def test_the_router_refuses_bad_fields(
    router: TestClient, path: str, extra: dict[str, Any], reason: str
) -> None:
    body = {"prompt": "hi", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    async with router.post(path, json={**body, **extra}) as resp:
        doc = await resp.json()
        assert resp.status == 400, doc
    assert doc["error"]["type"] == "invalid_request_error"
    assert reason in doc["error"]["message"]
    assert len(json.dumps(doc)) < 1000  # nothing echoed whole


async def test_the_router_serves_only_its_model(router: TestClient) -> None:
    body = {"prompt": "hi", "max_tokens": 2}
    async with router.post("/v1/completions", json={**body, "model": "other"}) as resp:
        assert resp.status == 404
        doc = await resp.json()
    assert doc["error"]["type"] == "NotFoundError"
    assert doc["error"]["message"] == "The model `other` does not exist."
    async with router.get("/v1/models") as resp:
        served = [m["id"] for m in (await resp.json())["data"]]
    assert served == [MODEL]
    for ok in ({"model": MODEL}, {}, {"model": None}, {"n": 1, "best_of": None, "stream": False}):
        async with router.post("/v1/completions", json={**body, **ok}) as resp:
            assert resp.status not in (400, 404), await resp.text()  # taken (then no instance)


def _pd(extra: dict[str, Any]) -> dict[str, Any]:
    return {"prompt": "hi", "max_tokens": 2, "bootstrap_host": "127.0.0.1",
            "bootstrap_port": 9, "bootstrap_room": 1, **extra}  # fmt: skip


@pytest.mark.parametrize(("extra", "reason"), BAD, ids=[r for _, r in BAD])
async def test_the_router_facing_api_refuses_bad_fields(extra: dict[str, Any], reason: str) -> None:
    with pytest.raises(web.HTTPBadRequest) as err:
        await parse_request(_pd(extra), chat=False, max_output_tokens=100, model=MODEL)
    assert reason in json.loads(err.value.text or "")["error"]["message"]


async def test_the_router_facing_api_takes_what_the_gateway_sent() -> None:
    """Every recorded gateway body parses: the client's `model` ("m") is echoed back."""
    seen = 0
    for path in sorted(FIXTURES.glob("*.json")):
        for r in json.loads(path.read_text())["requests"]:
            body = r["body"]
            if not (isinstance(body, dict) and "bootstrap_room" in body):
                continue
            chat = r["path"] == "/v1/chat/completions"
            req = await parse_request(body, chat=chat, max_output_tokens=100, model=MODEL)
            assert req.model == body["model"] and req.stream == body["stream"]
            seen += 1
    assert seen >= 8
    req = await parse_request(_pd({}), chat=False, max_output_tokens=100, model=MODEL)
    assert req.model == MODEL  # no name: the served one
