"""Fixtures for the KV transfer tests: a receiver, and fault proxies (testbed.transfer.fault_proxy)
that place faults at exact byte offsets so the tests fail deterministically."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from testbed.transfer import KVReceiver
from testbed.transfer.fault_proxy import FaultProxy


@pytest.fixture
async def receiver() -> AsyncIterator[KVReceiver]:
    async with KVReceiver(keep_payload=True, frame_timeout=5.0) as rx:
        yield rx


ProxyFactory = Callable[..., Awaitable[FaultProxy]]


@pytest.fixture
async def make_proxy() -> AsyncIterator[ProxyFactory]:
    """`await make_proxy(upstream_port, flip_at=..., reset_after=...)`; closed after the test."""
    proxies: list[FaultProxy] = []

    async def factory(upstream_port: int, **faults: int | None) -> FaultProxy:
        proxy = FaultProxy(upstream_port, **faults)
        await proxy.start()
        proxies.append(proxy)
        return proxy

    yield factory
    for p in proxies:
        await p.aclose()
