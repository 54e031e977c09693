"""A real decode process under the floods of issue #12 item 11 (testbed.transfer.flood).

The decode's /stats reports what its KV receiver holds; after each flood it holds nothing for
the flood's ids, and the process's resident set grows by less than 16 MiB in all (the floods made
it grow by 164 MiB and 163 MiB before; bench/receiver_flood.py prints the figures).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from testbed.services.spec import ServiceSpec
from testbed.substrate.local import LocalService, start_service, stop_services
from testbed.transfer import flood
from testbed.transfer.wire import AckStatus

pytestmark = pytest.mark.timeout(180)

MIB = 1 << 20


@pytest.fixture
async def decode(tmp_path: Path) -> AsyncIterator[LocalService]:
    svc = await start_service(ServiceSpec(role="decode", id="flooded", kv_timeout_s=30), tmp_path)
    try:
        yield svc
    finally:
        await stop_services([svc])


async def _stats(svc: LocalService) -> dict[str, Any]:
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as s,
        s.get(f"{svc.url}/stats") as resp,
    ):
        doc: dict[str, Any] = await resp.json()
        return doc


async def test_floods_leave_nothing_behind_in_a_decode_process(decode: LocalService) -> None:
    host, port = decode.spec.host, decode.ports["kv"]
    rss0 = flood.rss_bytes(decode.pid)
    acks = await flood.unique_ids(host, port, 20_000)
    assert acks == {AckStatus.FAILED: 20_000}
    stats = await _stats(decode)
    assert stats["kv_requests_tracked"] == 0 and stats["kv_frames_refused"] == 20_000
    assert await flood.huge_layer(host, port) == {AckStatus.FAILED: 1}
    async with flood.stalled_headers(host, port) as still_open:
        held = await _stats(decode)
        rss1 = flood.rss_bytes(decode.pid)
    assert still_open == 10
    assert held["kv_connections_open"] >= 10
    assert held["kv_buffer_bytes"] <= 10 * MIB  # not the 160 MiB the headers promise
    assert held["kv_requests_tracked"] == 0 and held["kv_payload_bytes"] == 0
    assert rss1 - rss0 < 16 * MIB, f"decode RSS grew by {(rss1 - rss0) / MIB:.1f} MiB"
