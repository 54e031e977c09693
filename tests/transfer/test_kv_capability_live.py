"""Only the sender the router assigned can touch a request's KV (issue #12 item 12), live.

A hostile local process connects to a decode's KV port and sends ABORT frames for the ids it can
guess: the router's sequential ids (q000001, ...), the client-chosen id and its retry suffixes.
Nothing fails: the wire id of each attempt is an unguessable token the router hands only to the
decode (in /decode) and to the prefill (in /prefill), and frames for ids the decode was not told
to expect create no state. Real processes on loopback (emulated engine, a high time_scale).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from testbed.services.spec import InstanceInfo, ServiceSpec
from testbed.substrate.local import LocalService, start_service, stop_services
from testbed.transfer.wire import AbortFrame, encode_frame_bytes

pytestmark = pytest.mark.timeout(120)


def _spec(role: str, sid: str, **kw: Any) -> ServiceSpec:
    return ServiceSpec(role=role, id=sid, time_scale=200.0, byte_scale=1e4, **kw)


@pytest.fixture
async def deployment(tmp_path: Path) -> AsyncIterator[tuple[LocalService, LocalService]]:
    """(router, decode): one prefill and one decode process behind a router. The prefill is
    started without a target list, as a hand-built deployment would be: the router hands it
    its instance table when the prefill asks (428)."""
    started: list[LocalService] = []
    try:
        prefill = await start_service(_spec("prefill", "local-prefill-0"), tmp_path)
        started.append(prefill)
        decode = await start_service(_spec("decode", "local-decode-0", kv_timeout_s=20), tmp_path)
        started.append(decode)
        kv = decode.ports["kv"]
        instances = [
            InstanceInfo(id=prefill.spec.id, cluster="local", role="prefill", url=prefill.url),
            InstanceInfo(
                id=decode.spec.id,
                cluster="local",
                role="decode",
                url=decode.url,
                kv_host="127.0.0.1",
                kv_port=kv,
                kv_link_host="127.0.0.1",
                kv_link_port=kv,
            ),
        ]
        router = await start_service(
            _spec("router", "router", instances=instances, threshold_tokens=1e9), tmp_path
        )
        started.append(router)
        yield router, decode
    finally:
        await stop_services(started)


async def _abort_flood(kv_port: int, ids: list[str]) -> None:
    _, writer = await asyncio.open_connection("127.0.0.1", kv_port)
    for rid in ids:
        writer.write(encode_frame_bytes(AbortFrame(rid, "hostile")))
    await writer.drain()
    writer.close()


async def _generate(router: LocalService, body: dict[str, Any]) -> dict[str, Any]:
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session,
        session.post(f"{router.url}/generate", json=body) as resp,
    ):
        lines = [json.loads(line) async for line in resp.content if line.strip()]
    rec: dict[str, Any] = next(doc["record"] for doc in lines if "record" in doc)
    return rec


async def test_abort_frames_with_guessed_ids_fail_nothing(
    deployment: tuple[LocalService, LocalService],
) -> None:
    router, decode = deployment
    guessed = [f"q{i:06d}" for i in range(1, 6)] + ["mine"]
    guessed += [f"{g}.{a}" for g in guessed for a in (1, 2)]
    await _abort_flood(decode.ports["kv"], guessed)
    recs = [
        await _generate(router, {"id": "mine", "input_tokens": 2000, "output_tokens": 4}),
        await _generate(router, {"input_tokens": 2000, "output_tokens": 4}),
    ]
    for rec in recs:
        assert rec["status"] == "completed", rec["failure_reason"]
        assert rec["retries"] == 0 and rec["kv_verified"]
    # the client-visible ids are kept in the records: the second is a router id we "guessed"
    assert recs[0]["id"] == "mine" and recs[1]["id"] in guessed
    # frames sent while the requests ran (the ids are known by now) fail nothing either
    flood = asyncio.create_task(_abort_flood(decode.ports["kv"], guessed))
    rec = await _generate(router, {"id": "mine-2", "input_tokens": 2000, "output_tokens": 4})
    await flood
    assert rec["status"] == "completed" and rec["retries"] == 0, rec["failure_reason"]
