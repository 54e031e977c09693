"""The browser guard (testbed.serving.browser_guard, issue 33 defect 7): a state-changing request
a web page could make a browser send is refused with a 403 JSON error on every server
start_http serves (the router among them), while the testbed's own clients, `curl -d` with its
form content type included, are served as before."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiohttp.test_utils import make_mocked_request

from testbed.link.client import LinkClient
from testbed.link.server import LinkServer, start_link_server
from testbed.services.router import create_app as router_app
from testbed.services.spec import ServiceSpec
from testbed.serving import HttpServer, browser_refusal, start_http

pytestmark = pytest.mark.timeout(120)

HOST = "127.0.0.1:8000"
JSON = {"Content-Type": "application/json"}
TEXT = {"Content-Type": "text/plain"}
FORM = {"Content-Type": "application/x-www-form-urlencoded"}

REFUSED = [
    ("POST", {"Origin": "http://evil.example", **TEXT}),
    ("POST", {"Origin": "http://evil.example", **JSON}),
    ("DELETE", {"Origin": "http://127.0.0.1:3000", **JSON}),  # another port: another origin
    ("POST", {"Origin": "null", **TEXT}),  # a sandboxed frame, a file:// page
    ("POST", {"Origin": "https://127.0.0.1:8000", **JSON}),  # another scheme
    ("PUT", {"Sec-Fetch-Site": "cross-site", **JSON}),
    ("PATCH", {"Sec-Fetch-Site": "same-site", **JSON}),  # localhost:3000 is the same site
    ("POST", {"Sec-Fetch-Mode": "no-cors", **TEXT}),  # a form, same origin or not
    ("POST", {"Origin": f"http://{HOST}", **FORM}),
    ("POST", {"Origin": f"http://{HOST}", "Sec-Fetch-Site": "same-origin"}),  # untyped body
]
SERVED = [
    ("POST", JSON),  # aiohttp clients, the OpenAI client, AIPerf, sglang-router, vllm-router
    ("POST", FORM),  # curl -d
    ("POST", TEXT),
    ("POST", {}),
    ("POST", {"Origin": f"http://{HOST}", "Sec-Fetch-Site": "same-origin", **JSON}),
    ("GET", {"Origin": "http://evil.example", "Sec-Fetch-Site": "cross-site"}),  # unreadable
    ("POST", {"User-Agent": "Mozilla/5.0", **JSON}),  # only the strict rule looks at the agent
]


@pytest.mark.parametrize(("method", "headers"), REFUSED)
def test_browser_requests_are_refused(method: str, headers: dict[str, str]) -> None:
    request = make_mocked_request(method, "/v1/completions", headers={"Host": HOST, **headers})
    assert browser_refusal(request) is not None


@pytest.mark.parametrize(("method", "headers"), SERVED)
def test_the_testbed_clients_are_served(method: str, headers: dict[str, str]) -> None:
    request = make_mocked_request(method, "/v1/completions", headers={"Host": HOST, **headers})
    assert browser_refusal(request) is None


def test_a_rebinding_name_is_not_an_own_origin() -> None:
    """DNS rebinding makes evil.example resolve to 127.0.0.1: same-origin to the browser."""
    headers = {"Host": "evil.example:8000", "Origin": "http://evil.example:8000", **JSON}
    assert browser_refusal(make_mocked_request("POST", "/generate", headers=headers))
    headers = {"Host": "localhost:8000", "Origin": "http://localhost:8000", **JSON}
    assert browser_refusal(make_mocked_request("POST", "/generate", headers=headers)) is None


def test_strict_refuses_any_browser_agent() -> None:
    request = make_mocked_request("GET", "/proxies", headers={"User-Agent": "Mozilla/5.0"})
    assert browser_refusal(request, strict=True) == "User agent not allowed"
    assert browser_refusal(request) is None


@pytest.fixture
async def router() -> AsyncIterator[HttpServer]:
    spec = ServiceSpec(role="router", id="guard", hardware="h20x8", time_scale=1000)
    app, _ = await router_app(spec)
    server = await start_http(app, name="router")
    try:
        yield server
    finally:
        await server.close()


BODY = json.dumps({"model": "m", "prompt": "hi", "max_tokens": 2})


async def test_router_refuses_a_foreign_text_plain_post(router: HttpServer) -> None:
    """Before: the router parsed the text/plain body as JSON and served it."""
    url = f"http://127.0.0.1:{router.port}/v1/completions"
    headers = {"Origin": "http://evil.example", **TEXT}
    async with aiohttp.ClientSession() as s, s.post(url, data=BODY, headers=headers) as r:
        assert r.status == 403
        assert "cross-origin" in (await r.json())["error"]


@pytest.mark.parametrize("headers", [TEXT, FORM, JSON], ids=["text", "curl-d", "json"])
async def test_router_serves_the_same_without_an_origin(
    router: HttpServer, headers: dict[str, str]
) -> None:
    url = f"http://127.0.0.1:{router.port}/v1/completions"
    async with aiohttp.ClientSession() as s, s.post(url, data=BODY, headers=headers) as r:
        doc = await r.json()
    # No worker is registered: the router's own answer (OpenAI-shaped), not the guard's.
    assert r.status != 403 and isinstance(doc["error"], dict), doc


@pytest.fixture
async def link() -> AsyncIterator[LinkServer]:
    server = await start_link_server("127.0.0.1", 0)
    try:
        yield server
    finally:
        await server.close()


async def test_link_api_keeps_toxiproxys_guard_and_adds_the_cross_site_one(
    link: LinkServer,
) -> None:
    body = json.dumps({"name": "p", "upstream": "127.0.0.1:9"})
    async with aiohttp.ClientSession() as s:
        async with s.get(link.url + "/proxies", headers={"User-Agent": "Mozilla/5.0"}) as r:
            assert r.status == 403 and (await r.json())["status"] == 403
        headers = {"Origin": "http://evil.example", "User-Agent": "x", **TEXT}
        async with s.post(link.url + "/proxies", data=body, headers=headers) as r:
            assert r.status == 403
        assert link.emulator.proxies == {}
    async with LinkClient(link.url, timeout=5) as client:
        assert (await client.create_proxy("p", upstream="127.0.0.1:9"))["name"] == "p"
