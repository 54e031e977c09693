"""A prefill worker sends KV only to receivers the deployment knows (issue #12 item 12).

`POST /prefill` and `POST /prefix/send` name the KV address to send to; any local process can
call them, so an address that is not one of the deployment's decode KV ports or link routes is
refused with a 4xx before any connection is opened. In-process (aiohttp test server).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from testbed.services.spec import ServiceSpec


class _Listener:
    """A TCP port that counts the connections made to it."""

    def __init__(self) -> None:
        self.accepted = 0
        self.server: asyncio.Server | None = None

    async def __aenter__(self) -> _Listener:
        self.server = await asyncio.start_server(self._on_conn, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()
        await self.server.wait_closed()

    async def _on_conn(self, _r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        self.accepted += 1
        w.close()

    @property
    def port(self) -> int:
        assert self.server is not None
        return int(self.server.sockets[0].getsockname()[1])


async def _client(**spec: Any) -> TestClient:
    from testbed.services.prefill import create_app

    app, _ = await create_app(ServiceSpec(role="prefill", id="p", time_scale=1000, **spec))
    client = TestClient(TestServer(app))
    await client.start_server()
    return client


@pytest.fixture
async def listener() -> AsyncIterator[_Listener]:
    async with _Listener() as lst:
        yield lst


async def _post(client: TestClient, path: str, body: dict[str, Any]) -> tuple[int, Any]:
    async with asyncio.timeout(20):
        resp = await client.post(path, json=body)
        return resp.status, await resp.json()


async def test_prefill_without_known_targets_refuses_and_connects_nowhere(
    listener: _Listener,
) -> None:
    client = await _client()
    try:
        body = {"id": "x", "uncached_tokens": 100, "kv_host": "127.0.0.1", "kv_port": listener.port}
        status, doc = await _post(client, "/prefill", body)
        assert 400 <= status < 500 and "error" in doc, (status, doc)
        status, doc = await _post(
            client, "/prefix/send", {**body, "tokens": 100, "uncached_tokens": None}
        )
        assert 400 <= status < 500 and "error" in doc, (status, doc)
        await asyncio.sleep(0.05)
        assert listener.accepted == 0
    finally:
        await client.close()


async def test_prefill_sends_only_to_the_targets_it_was_given(listener: _Listener) -> None:
    from testbed.transfer import KVReceiver

    async with KVReceiver() as rx:
        known = ("127.0.0.1", rx.port)
        client = await _client(kv_targets=[known], byte_scale=1e5)
        try:
            body = {"id": "w", "uncached_tokens": 100, "kv_host": "127.0.0.1"}
            status, doc = await _post(client, "/prefill", {**body, "kv_port": listener.port})
            assert status == 403 and "not a KV receiver" in doc["error"]
            send = {"id": "w", "tokens": 100, "kv_host": "127.0.0.1", "kv_port": listener.port}
            status, doc = await _post(client, "/prefix/send", send)
            assert status == 403
            # a spec's list is for good: nobody can widen it
            status, doc = await _post(client, "/targets", {"targets": [["127.0.0.1", 9]]})
            assert status == 409
            # the known receiver is served (it expects the id, as a decode would)
            rx.expect("w")
            status, doc = await _post(client, "/prefill", {**body, "kv_port": rx.port})
            assert status == 200, doc
            assert (await rx.wait("w", 5)).total_bytes == doc["kv_wire_bytes_sent"] > 0
        finally:
            await client.close()
    await asyncio.sleep(0.05)
    assert listener.accepted == 0


async def test_targets_can_be_set_once(listener: _Listener) -> None:
    client = await _client()
    try:
        for bad in (None, [], [["h"]], [["h", 0]], [["", 1]], [["h", "1"]], [["h", True]]):
            status, _ = await _post(client, "/targets", {"targets": bad})
            assert status == 400, bad
        status, _ = await _post(client, "/targets", {"targets": [["127.0.0.1", 9]]})
        assert status == 200
        status, _ = await _post(client, "/targets", {"targets": [["127.0.0.1", listener.port]]})
        assert status == 409  # first come, for good
        body = {"id": "x", "uncached_tokens": 100, "kv_host": "127.0.0.1", "kv_port": listener.port}
        status, _ = await _post(client, "/prefill", body)
        assert status == 403
        assert listener.accepted == 0
    finally:
        await client.close()
