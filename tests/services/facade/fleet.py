"""Two prefill and two decode workers with the router-facing API, in-process on loopback, for
the façade's tests (both flavours): PrfaaS prefills, local decodes, so every KV is a cross-
cluster send (through the decode's "link" address, here its KV port)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from testbed.services.decode import create_app as decode_app
from testbed.services.facade.journal import VERIFIED
from testbed.services.prefill import STATE as PREFILL_STATE
from testbed.services.prefill import create_app as prefill_app
from testbed.services.spec import InstanceInfo, ServiceSpec

FIXTURES = Path(__file__).parent / "fixtures"
SCALE = {"time_scale": 200.0, "byte_scale": 20000.0}


def server(app: web.Application) -> TestServer:
    """As the services serve (services.host): a closed connection cancels its handler."""
    return TestServer(app, host="127.0.0.1", handler_cancellation=True)


def hold_prefills(client: TestClient, monkeypatch: pytest.MonkeyPatch) -> None:
    """Hold every prefill of this worker at its start until it is cancelled. A test that cancels
    a running prefill must not race the prefill's end: with a long prompt timed in wall seconds
    instead, a loaded machine let the prompt finish between two polls (a 200, not the 503)."""
    state = client.server.app[PREFILL_STATE]

    async def held(_job: object) -> None:
        await asyncio.Event().wait()

    monkeypatch.setattr(state, "prefill", held)


def fixture(router: str, name: str) -> dict[str, Any]:
    return json.loads((FIXTURES / router / f"{name}.json").read_text())


@dataclass
class Fleet:
    prefill: list[TestClient]
    decode: list[TestClient]


async def make_fleet(
    flavour: Literal["sglang", "vllm"], kv_timeout_s: float = 30.0
) -> AsyncIterator[Fleet]:
    decodes = []
    for i in range(2):
        spec = ServiceSpec(role="decode", id=f"local-decode-{i}", facade=flavour,
                           kv_timeout_s=kv_timeout_s, **SCALE)  # fmt: skip
        app, ports = await decode_app(spec)
        decodes.append((TestClient(server(app)), ports["kv"]))
    table = [
        InstanceInfo(
            id=f"local-decode-{i}",
            cluster="local",
            role="decode",
            url="-",
            kv_host="127.0.0.1",
            kv_port=port,
            kv_link_host="127.0.0.1",
            kv_link_port=port,
        )
        for i, (_, port) in enumerate(decodes)
    ]
    prefills = []
    for i in range(2):
        spec = ServiceSpec(role="prefill", id=f"prfaas-prefill-{i}", cluster="prfaas",
                           hardware="h200x8", facade=flavour, facade_decodes=table,
                           kv_timeout_s=kv_timeout_s,
                           kv_targets=[("127.0.0.1", p) for _, p in decodes], **SCALE)  # fmt: skip
        app, _ = await prefill_app(spec)
        prefills.append(TestClient(server(app)))
    clients = [c for c, _ in decodes] + prefills
    for c in clients:
        await c.start_server()
    try:
        yield Fleet(prefills, [c for c, _ in decodes])
    finally:
        for c in clients:
            await c.close()


async def attempts(client: TestClient, progress: bool = False) -> list[dict[str, Any]]:
    """The worker's journaled attempts: their outcomes, with `progress` the decode halves'
    VERIFIED entries too."""
    doc = await (await client.get("/facade/attempts")).json()
    return [a for a in doc["attempts"] if progress or a["outcome"] != VERIFIED]
