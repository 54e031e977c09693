"""The router's side of the KV handshake (issue #12 items 11 and 12), against fake instances.

The decode must register a request's wire id with its KV receiver before any frame can arrive,
so the router starts the prefill only after the decode's first line (`{"expecting": true}`).
The wire id is a fresh random token per attempt, handed only to that decode and that prefill;
the client-visible id goes along as a label. A prefill worker that does not know the
deployment's KV receivers (428) gets them from the router's instance table. In-process.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from testbed.clock import LiveClock
from testbed.services.spec import InstanceInfo, ServiceSpec


class Fakes:
    def __init__(self) -> None:
        self.events: list[str] = []
        self.release = asyncio.Event()  # the decode registers only when the test says so
        self.decode_called = asyncio.Event()
        self.decode_bodies: list[dict[str, Any]] = []
        self.prefill_bodies: list[dict[str, Any]] = []
        self.targets: list[list[Any]] | None = None

    async def decode(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.decode_bodies.append(body)
        self.decode_called.set()
        resp = web.StreamResponse()
        await resp.prepare(request)
        await self.release.wait()
        self.events.append("registered")
        await resp.write(b'{"expecting":true}\n')
        n = body["output_tokens"]
        for doc in (
            {"admitted": True, "kv_verified": True},
            {"tokens": n},
            {
                "done": True,
                "tokens": n,
                "first_token": 1.0,
                "last_token": 2.0,
                "kv_wire_bytes": body["expected_wire_bytes"],
                "kv_verified": True,
            },
        ):
            await resp.write(json.dumps(doc).encode() + b"\n")
        return resp

    async def cancel(self, request: web.Request) -> web.Response:
        self.events.append("cancelled")
        return web.json_response({"ok": True})

    async def prefill(self, request: web.Request) -> web.Response:
        body = await request.json()
        if self.targets is None:
            self.events.append("prefill refused: no targets")
            return web.json_response({"error": "no targets"}, status=428)
        self.events.append("prefill")
        self.prefill_bodies.append(body)
        return web.json_response({"kv_wire_bytes_sent": 1})

    async def set_targets(self, request: web.Request) -> web.Response:
        self.targets = (await request.json())["targets"]
        self.events.append("targets")
        return web.json_response({"targets": len(self.targets or [])})


@pytest.fixture
async def setup() -> AsyncIterator[tuple[Fakes, TestClient]]:
    fakes = Fakes()
    dec = web.Application()
    dec.router.add_post("/decode", fakes.decode)
    dec.router.add_delete("/decode/{rid}", fakes.cancel)
    pre = web.Application()
    pre.router.add_post("/prefill", fakes.prefill)
    pre.router.add_post("/targets", fakes.set_targets)
    servers = [TestServer(dec), TestServer(pre)]
    for s in servers:
        await s.start_server()
    from testbed.services.router import create_app

    instances = [
        InstanceInfo(id="p", cluster="local", role="prefill", url=str(servers[1].make_url(""))),
        InstanceInfo(
            id="d",
            cluster="local",
            role="decode",
            url=str(servers[0].make_url("")),
            kv_host="127.0.0.1",
            kv_port=7001,
            kv_link_host="127.0.0.2",
            kv_link_port=7002,
        ),
    ]
    spec = ServiceSpec(role="router", id="r", instances=instances, threshold_tokens=1e9)
    app, _ = await create_app(spec)
    client = TestClient(TestServer(app))
    await client.start_server()
    try:
        yield fakes, client
    finally:
        await client.close()
        for s in servers:
            await s.close()


async def _generate(client: TestClient, body: dict[str, Any]) -> dict[str, Any]:
    resp = await client.post("/generate", json=body)
    lines = [json.loads(line) async for line in resp.content if line.strip()]
    rec: dict[str, Any] = lines[-1]["record"]
    return rec


async def test_prefill_starts_only_after_the_decode_registered(
    setup: tuple[Fakes, TestClient],
) -> None:
    fakes, client = setup
    async with asyncio.timeout(30):
        job = asyncio.create_task(
            _generate(client, {"id": "client-1", "input_tokens": 1000, "output_tokens": 3})
        )
        await fakes.decode_called.wait()
        for _ in range(20):  # the router has every chance to jump ahead: it must not
            await asyncio.sleep(0.01)
        assert fakes.events == []
        fakes.release.set()
        rec = await job
    assert rec["status"] == "completed", rec["failure_reason"]
    assert rec["id"] == "client-1"
    assert fakes.events == ["registered", "prefill refused: no targets", "targets", "prefill"]
    # the deployment's KV receivers, from the router's instance table
    assert fakes.targets == [["127.0.0.1", 7001], ["127.0.0.2", 7002]]
    (dec,) = fakes.decode_bodies
    (pre,) = fakes.prefill_bodies
    assert dec["id"] == pre["id"] != "client-1"  # one wire id, handed to both ends
    assert dec["request"] == "client-1"  # the client-visible id, for the decode's logs
    assert len(dec["id"]) >= 20 and not dec["id"].startswith("client-1")


async def test_each_attempt_gets_a_fresh_unguessable_wire_id(
    setup: tuple[Fakes, TestClient],
) -> None:
    fakes, client = setup
    fakes.release.set()
    fakes.targets = []
    async with asyncio.timeout(30):
        for _ in range(3):
            rec = await _generate(client, {"input_tokens": 100, "output_tokens": 1})
            assert rec["status"] == "completed", rec["failure_reason"]
    ids = [b["id"] for b in fakes.decode_bodies]
    assert len(set(ids)) == 3
    assert not any(i.startswith("q0") for i in ids)
    assert [b["request"] for b in fakes.decode_bodies] == ["q000001", "q000002", "q000003"]


async def test_a_prefix_pull_is_sent_only_after_the_receiver_registered_it() -> None:
    import aiohttp

    from testbed.services import cache_pull

    events: list[str] = []
    release, sent = asyncio.Event(), asyncio.Event()
    seen: dict[str, Any] = {}

    async def receive(request: web.Request) -> web.StreamResponse:
        seen["receive"] = await request.json()
        resp = web.StreamResponse()
        await resp.prepare(request)
        await release.wait()
        events.append("registered")
        await resp.write(b'{"expecting":true}\n')
        await sent.wait()
        await resp.write(b'{"kv_wire_bytes":1,"kv_verified":true}\n')
        return resp

    async def send(request: web.Request) -> web.Response:
        seen["send"] = await request.json()
        if "targets" not in seen:
            events.append("send refused: no targets")
            return web.json_response({"error": "no targets"}, status=428)
        events.append("send")
        sent.set()
        return web.json_response({"kv_wire_bytes_sent": 1})

    async def targets(request: web.Request) -> web.Response:
        seen["targets"] = (await request.json())["targets"]
        events.append("targets")
        return web.json_response({})

    dst, src = web.Application(), web.Application()
    dst.router.add_post("/prefix/receive", receive)
    src.router.add_post("/prefix/send", send)
    src.router.add_post("/targets", targets)
    servers = [TestServer(dst), TestServer(src)]
    for s in servers:
        await s.start_server()
    target = InstanceInfo(
        id="d",
        cluster="local",
        role="decode",
        url=str(servers[0].make_url("")),
        kv_link_host="127.0.0.2",
        kv_link_port=7002,
    )
    source = InstanceInfo(
        id="p", cluster="prfaas", role="prefill", url=str(servers[1].make_url(""))
    )
    try:
        async with aiohttp.ClientSession() as session, asyncio.timeout(30):
            pull = asyncio.create_task(
                cache_pull.pull_prefix(
                    session,
                    source=source,
                    target=target,
                    tokens=1024,
                    model=ServiceSpec(role="router", id="r").model,
                    byte_scale=1e4,
                    clock=LiveClock(),
                    timeout_s=20,
                    label="client-7",
                    kv_targets=[("127.0.0.2", 7002)],
                )
            )
            for _ in range(20):
                await asyncio.sleep(0.01)
            assert events == []  # nothing is sent before the receiver expects it
            release.set()
            result = await pull
    finally:
        for s in servers:
            await s.close()
    assert result.ok, result.status
    assert events == ["registered", "send refused: no targets", "targets", "send"]
    assert seen["targets"] == [["127.0.0.2", 7002]]
    assert seen["receive"]["id"] == seen["send"]["id"] != "client-7"
    assert seen["receive"]["request"] == "client-7"
