"""Every prefill job ends, completed or failed with a reason, whatever its KV sender raises
(issue #12 item 3): an exception nobody foresaw used to leave `/prefill` hanging until the
router's 600 s timeout, after which the router blamed a healthy instance. In-process."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from testbed.services.prefill import STATE, create_app
from testbed.services.spec import ServiceSpec

BODY = {"id": "r1", "uncached_tokens": 2000, "kv_host": "127.0.0.1", "kv_port": 9}


@pytest.fixture
async def prefill() -> AsyncIterator[TestClient]:
    spec = ServiceSpec(
        role="prefill",
        id="p",
        cluster="prfaas",
        hardware="h200x8",
        time_scale=500,
        kv_targets=[("127.0.0.1", 9)],
    )
    app, _ = await create_app(spec)
    async with TestClient(TestServer(app)) as client:
        yield client


class _Boom(Exception):
    pass


@pytest.mark.parametrize("where", ["sender", "open", "send_layer"])
async def test_unexpected_sender_errors_fail_the_job_with_their_reason(
    prefill: TestClient, where: str
) -> None:
    state = prefill.server.app[STATE]

    class Tx:
        async def __aenter__(self) -> Tx:
            if where == "open":
                raise _Boom("open broke")
            return self

        async def __aexit__(self, *exc: object) -> None:
            return None

        async def send_layer(self, layer: int, data: Any) -> None:
            raise _Boom("send broke")

    class Sender:
        def open(self, rid: str, sizes: list[int]) -> Tx:
            return Tx()

    async def sender(target: tuple[str, int]) -> Sender:
        if where == "sender":
            raise _Boom("no sender")
        return Sender()

    state.sender = sender  # type: ignore[method-assign,assignment]
    async with asyncio.timeout(30):  # the bug is a hang: bounded, not a speed claim
        resp = await prefill.post("/prefill", json=BODY)
        doc = await resp.json()
    assert resp.status == 502
    assert "_Boom" in doc["error"], doc
    stats = await (await prefill.get("/stats")).json()
    assert stats["failed"] == 1 and stats["completed"] == 0
    assert stats["transfers_in_flight"] == 0
    # the instance keeps serving: the next job is answered too
    async with asyncio.timeout(30):
        resp = await prefill.post("/prefill", json={**BODY, "id": "r2"})
    assert resp.status == 502
