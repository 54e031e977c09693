"""Acceptance 5: bad input gets Toxiproxy-style 4xx JSON errors, the server keeps running, and
no open connection is disturbed by a failed call."""

from __future__ import annotations

import asyncio
import hashlib
import json

import aiohttp
import pytest

from testbed.link.client import LinkApiError, LinkClient
from testbed.link.server import LinkServer

pytestmark = pytest.mark.timeout(60)


async def _raw(link: LinkServer, method: str, path: str, data: str | None = None):  # type: ignore[no-untyped-def]
    async with aiohttp.ClientSession() as s, s.request(method, link.url + path, data=data) as r:
        return r.status, await r.text()


BAD_TOXICS = [
    ("{bad json", 400, "bad request body"),
    ("[1, 2]", 400, "bad request body"),
    ('{"type": "no_such_toxic"}', 400, "invalid toxic type"),
    ('{"type": "latency", "stream": "sideways"}', 400, "stream was invalid"),
    ('{"type": "latency", "toxicity": "high"}', 400, "toxicity"),
    ('{"type": "latency", "toxicity": 1.5}', 400, "toxicity"),
    ('{"type": "latency", "attributes": {"latency": "slow"}}', 400, "must be a number"),
    ('{"type": "latency", "attributes": [1]}', 400, "attributes must be an object"),
    ('{"type": "bandwidth", "attributes": {"rate": 0}}', 400, "greater than 0"),
    ('{"type": "bandwidth", "attributes": {"rate": -100}}', 400, "greater than 0"),
    ('{"type": "link_bandwidth", "attributes": {"rate": 0}}', 400, "rate"),
    ('{"type": "latency", "name": "dup"}', 409, "toxic already exists"),
    ("", 400, "bad request body"),
]


async def test_bad_input_errors_and_undisturbed_connection(link: LinkServer, echo, addr_of):  # type: ignore[no-untyped-def]
    async with LinkClient(link.url) as c:
        p = await c.create_proxy("p", upstream=f"{echo[0]}:{echo[1]}")
        await c.add_toxic("p", "latency", name="dup", attributes={"latency": 1})
        r, w = await asyncio.open_connection(*addr_of(p))
        payload = bytes(range(256)) * 4096  # 1 MiB
        received = bytearray()

        async def pump() -> None:
            for i in range(0, len(payload), 65536):
                w.write(payload[i : i + 65536])
                await w.drain()
                await asyncio.sleep(0.005)

        async def collect() -> None:
            while len(received) < len(payload):
                received.extend(await r.read(65536))

        traffic = asyncio.gather(pump(), asyncio.wait_for(collect(), 20))
        for body, status, message in BAD_TOXICS:
            got_status, text = await _raw(link, "POST", "/proxies/p/toxics", body)
            err = json.loads(text)
            assert got_status == status, (body, text)
            assert err["status"] == status and message in err["error"], (body, err)
        for method, path, body, status in [
            ("POST", "/proxies", '{"name": "p", "upstream": "127.0.0.1:1"}', 409),
            ("POST", "/proxies", '{"upstream": "127.0.0.1:1"}', 400),
            ("POST", "/proxies", '{"name": "q"}', 400),
            ("POST", "/proxies", '{"name": "q", "upstream": "nohost"}', 400),
            ("POST", "/proxies", '{"name": "q", "upstream": "127.0.0.1:1", "enabled": 1}', 400),
            ("POST", "/proxies", "{{", 400),
            ("GET", "/proxies/none", None, 404),
            ("DELETE", "/proxies/none", None, 404),
            ("POST", "/proxies/p", '{"enabled": "yes"}', 400),
            ("GET", "/proxies/p/toxics/none", None, 404),
            ("PATCH", "/proxies/p/toxics/none", "{}", 404),
            ("PATCH", "/proxies/p/toxics/dup", '{"attributes": {"latency": -4}}', 400),
            ("PATCH", "/proxies/p/toxics/dup", '{"toxicity": "x"}', 400),
            ("DELETE", "/proxies/p/toxics/none", None, 404),
            ("GET", "/proxies/none/toxics", None, 404),
            ("POST", "/populate", '{"not": "a list"}', 400),
            ("POST", "/populate", '[{"name": "x"}]', 400),
            ("POST", "/reset", '{"seed": "x"}', 400),
        ]:
            got_status, text = await _raw(link, method, path, body)
            assert got_status == status, (method, path, body, text)
            assert json.loads(text)["status"] == status
        await traffic
        assert hashlib.sha256(received).digest() == hashlib.sha256(payload).digest()
        # The failed update left the toxic as it was; the server still answers.
        assert (await c.get_toxic("p", "dup"))["attributes"]["latency"] == 1
        assert (await c.version()).startswith("2.")
        w.close()


async def test_client_raises_with_status(client: LinkClient) -> None:
    with pytest.raises(LinkApiError) as info:
        await client.get_proxy("missing")
    assert info.value.status == 404 and info.value.message == "proxy not found"


async def test_browser_user_agent_is_refused(link: LinkServer) -> None:
    async with (
        aiohttp.ClientSession() as s,
        s.get(link.url + "/proxies", headers={"User-Agent": "Mozilla/5.0"}) as r,
    ):
        assert r.status == 403
