"""Hostile numbers and nesting on the link API (item 6): every request gets a Toxiproxy-style 4xx
JSON error, nothing is logged as a failure, and the server keeps serving and forwarding."""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import aiohttp
import pytest

from testbed.link.client import LinkClient
from testbed.link.server import LinkServer
from testbed.link.toxics import REGISTRY

pytestmark = pytest.mark.timeout(120)

BIG = "1" + "0" * 399  # a 400-digit integer, as JSON text
DEPTH = 100_000
DEEP_LIST = "[" * DEPTH + "]" * DEPTH
DEEP_OBJECT = '{"a":' * DEPTH + "1" + "}" * DEPTH

VALID_ATTRS: dict[str, dict[str, Any]] = {
    "latency": {"latency": 1},
    "bandwidth": {"rate": 1000},
    "slow_close": {"delay": 1},
    "timeout": {"timeout": 0},
    "reset_peer": {"timeout": 1000},
    "slicer": {"average_size": 64, "size_variation": 8, "delay": 10},
    "limit_data": {"bytes": 1_000_000},
    "noop": {},
    "link_bandwidth": {"rate": 1_000_000},
}


def _numeric_attrs() -> list[tuple[str, str]]:
    return [
        (t, a.name) for t, cls in REGISTRY.items() for a in cls.attrs if a.kind in ("int", "float")
    ]


def _schedule(steps: str) -> str:
    return f'{{"type": "link_bandwidth", "name": "s", "attributes": {{"schedule": {steps}}}}}'


def _hostile_requests(proxy: str, echo: str) -> list[tuple[str, str, str]]:
    """(method, path, raw body) for every hostile number and every deep body."""
    reqs: list[tuple[str, str, str]] = []
    for big in (BIG, "-" + BIG, "1e400", "-1e400"):
        # toxics: toxicity and every numeric attribute of every type, on create and update
        reqs.append(("POST", f"/proxies/{proxy}/toxics", f'{{"type": "noop", "toxicity": {big}}}'))
        reqs.append(("PATCH", f"/proxies/{proxy}/toxics/t_noop", f'{{"toxicity": {big}}}'))
        for type_name, attr in _numeric_attrs():
            body = f'{{"type": "{type_name}", "name": "x", "attributes": {{"{attr}": {big}}}}}'
            reqs.append(("POST", f"/proxies/{proxy}/toxics", body))
            patch = f'{{"attributes": {{"{attr}": {big}}}}}'
            reqs.append(("PATCH", f"/proxies/{proxy}/toxics/t_{type_name}", patch))
        # schedule fields
        for sched in (
            f"[[{big}, 100]]",
            f"[[0, {big}]]",
            f'[{{"at": {big}, "rate": 100}}]',
            f'[{{"at": 0, "rate": {big}}}]',
            f"[[0, 100], [{big}, 200]]",
        ):
            reqs.append(("POST", f"/proxies/{proxy}/toxics", _schedule(sched)))
        body = f'{{"attributes": {{"schedule": [[0, 100]], "period": {big}}}}}'
        reqs.append(("PATCH", f"/proxies/{proxy}/toxics/t_link_bandwidth", body))
        # proxy fields, on create, update and populate; and the reset seed
        for field in ("name", "listen", "upstream", "enabled"):
            fields = {"name": '"q"', "upstream": f'"{echo}"', field: big}
            body = "{" + ", ".join(f'"{k}": {v}' for k, v in fields.items()) + "}"
            reqs.append(("POST", "/proxies", body))
            reqs.append(("POST", "/populate", f"[{body}]"))
            reqs.append(("PATCH", f"/proxies/{proxy}", f'{{"{field}": {big}}}'))
        reqs.append(("POST", "/reset", f'{{"seed": {big}}}'))
    # numbers hidden in strings: ports, durations and bandwidths
    for listen in (f"127.0.0.1:{BIG}", f"127.0.0.1:-{BIG}"):
        body = f'{{"name": "q", "listen": "{listen}", "upstream": "{echo}"}}'
        reqs.append(("POST", "/proxies", body))
        reqs.append(("PATCH", f"/proxies/{proxy}", f'{{"upstream": "{listen}"}}'))
    for sched in (f'[["{BIG}ms", 100]]', f'[[0, "{BIG}Mbps"]]', f'[["{BIG}", "{BIG}"]]'):
        reqs.append(("POST", f"/proxies/{proxy}/toxics", _schedule(sched)))
    # 100k-deep bodies on every route that reads one, bare and inside a valid-looking object
    for deep in (DEEP_LIST, DEEP_OBJECT):
        for method, path in (
            ("POST", "/proxies"),
            ("POST", "/populate"),
            ("PATCH", f"/proxies/{proxy}"),
            ("POST", f"/proxies/{proxy}/toxics"),
            ("PATCH", f"/proxies/{proxy}/toxics/t_latency"),
            ("POST", "/reset"),
        ):
            reqs.append((method, path, deep))
        attrs = f'{{"type": "latency", "name": "x", "attributes": {{"latency": {deep}}}}}'
        reqs.append(("POST", f"/proxies/{proxy}/toxics", attrs))
        reqs.append(("POST", "/proxies", f'{{"name": {deep}, "upstream": "{echo}"}}'))
    return reqs


async def test_overflowing_numbers_and_deep_json_get_4xx(
    link: LinkServer, echo: tuple[str, int], addr_of: Any, caplog: pytest.LogCaptureFixture
) -> None:
    upstream = f"{echo[0]}:{echo[1]}"
    async with LinkClient(link.url) as c:
        p = await c.create_proxy("p", upstream=upstream)
        for type_name, attrs in VALID_ATTRS.items():
            # toxicity 0: the toxics exist (to be updated) but leave the traffic alone
            await c.add_toxic("p", type_name, name=f"t_{type_name}", attributes=attrs, toxicity=0.0)
        before = await c.get_proxy("p")
        r, w = await asyncio.open_connection(*addr_of(p))
        w.write(b"before")
        assert await asyncio.wait_for(r.readexactly(6), 10) == b"before"

        reqs = _hostile_requests("p", upstream)
        assert len(reqs) > 200
        caplog.set_level(logging.INFO)
        async with aiohttp.ClientSession() as s:
            for method, path, body in reqs:
                async with s.request(method, link.url + path, data=body) as resp:
                    text = await resp.text()
                where = (method, path, body[:120])
                assert 400 <= resp.status < 500, (where, resp.status, text[:300])
                err = json.loads(text)
                assert err["status"] == resp.status, (where, err)
                assert isinstance(err["error"], str) and err["error"], (where, err)
                # one clear line, and the 400 digits are not echoed back
                assert "\n" not in err["error"] and len(err["error"]) < 300, (where, err)

        failures = [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]
        assert not failures, [r.getMessage() for r in failures[:3]]
        # nothing changed, the server still answers and the open connection still forwards
        assert await c.get_proxy("p") == before
        assert set(await c.proxies()) == {"p"}
        assert (await c.version()).startswith("2.")
        w.write(b"after")
        assert await asyncio.wait_for(r.readexactly(5), 10) == b"after"
        w.close()
