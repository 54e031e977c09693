"""Moving a proxy to an address that is taken (item 8): a 409 JSON error, and the proxy is exactly
as before: same listen address, same enabled state, its open connections still forwarding."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp
import pytest

from testbed.link.client import LinkApiError, LinkClient
from testbed.link.server import LinkServer

pytestmark = pytest.mark.timeout(60)


async def _echo_once(r: asyncio.StreamReader, w: asyncio.StreamWriter, data: bytes) -> bytes:
    w.write(data)
    return await asyncio.wait_for(r.readexactly(len(data)), 10)


async def test_listen_on_a_taken_address_is_409_and_changes_nothing(
    link: LinkServer, echo: tuple[str, int], addr_of: Any
) -> None:
    upstream = f"{echo[0]}:{echo[1]}"
    async with LinkClient(link.url) as c:
        a = await c.create_proxy("a", upstream=upstream)
        b = await c.create_proxy("b", upstream=upstream)
        r, w = await asyncio.open_connection(*addr_of(a))
        assert await _echo_once(r, w, b"one") == b"one"

        async with (
            aiohttp.ClientSession() as s,
            s.patch(f"{link.url}/proxies/a", data=json.dumps({"listen": b["listen"]})) as resp,
        ):
            status, err = resp.status, await resp.json(content_type=None)
        assert status == 409, err
        assert err["status"] == 409 and "address already in use" in err["error"].lower(), err

        assert await c.get_proxy("a") == a  # same listen address, still enabled
        assert await _echo_once(r, w, b"two") == b"two"  # the open connection still forwards
        r2, w2 = await asyncio.open_connection(*addr_of(a))  # and it still accepts
        assert await _echo_once(r2, w2, b"three") == b"three"
        w2.close()

        # Moving it somewhere free still works (and, as in Toxiproxy, restarts it).
        moved = await c.update_proxy("a", listen="127.0.0.1:0")
        assert moved["listen"] != a["listen"] and moved["enabled"] is True
        r3, w3 = await asyncio.open_connection(*addr_of(moved))
        assert await _echo_once(r3, w3, b"four") == b"four"
        w3.close()
        w.close()


async def test_enabling_on_a_taken_address_is_409_and_stays_disabled(
    link: LinkServer, echo: tuple[str, int]
) -> None:
    upstream = f"{echo[0]}:{echo[1]}"
    async with LinkClient(link.url) as c:
        b = await c.create_proxy("b", upstream=upstream)
        a = await c.create_proxy("a", upstream=upstream, enabled=False)
        with pytest.raises(LinkApiError) as info:
            await c.update_proxy("a", listen=b["listen"], enabled=True)
        assert info.value.status == 409
        assert await c.get_proxy("a") == a  # still disabled, same address
        # Disabled, the address is only written down (it is bound when the proxy is enabled).
        parked = await c.update_proxy("a", listen=b["listen"])
        assert parked["listen"] == b["listen"] and parked["enabled"] is False
        with pytest.raises(LinkApiError) as info:
            await c.enable("a")
        assert info.value.status == 409
        assert (await c.get_proxy("a"))["enabled"] is False


async def test_creating_on_a_taken_address_is_409(link: LinkServer, echo: tuple[str, int]) -> None:
    upstream = f"{echo[0]}:{echo[1]}"
    async with LinkClient(link.url) as c:
        b = await c.create_proxy("b", upstream=upstream)
        with pytest.raises(LinkApiError) as info:
            await c.create_proxy("a", upstream=upstream, listen=b["listen"])
        assert info.value.status == 409 and "address already in use" in info.value.message.lower()
        assert set(await c.proxies()) == {"b"}
