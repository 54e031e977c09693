"""The router against a live tiny deployment (1 PrfaaS + 1 PD-P + 1 PD-D, real processes):
request ids are unique, and a client that goes away is recorded as such, stops the work it
started downstream, and blames no instance (issue #12 items 4 and 5)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from testbed.scenario.plan import RunOptions, prepare_run
from testbed.scenario.runner import _Run
from testbed.scenario.schema import load_scenario

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "tests" / "data" / "tiny.yaml"

pytestmark = pytest.mark.slow


@pytest.fixture
async def deployment(tmp_path: Path) -> AsyncIterator[_Run]:
    opts = RunOptions(out_dir=tmp_path, progress=False)
    run = _Run(prepare_run(load_scenario(TINY), opts), opts)
    await run.start()
    try:
        yield run
    finally:
        await run.shutdown()


async def _generate(session: aiohttp.ClientSession, url: str, **body: Any) -> tuple[int, Any]:
    async with session.post(f"{url}/generate", json=body) as resp:
        if resp.status != 200:
            return resp.status, await resp.json()
        record = None
        async for line in resp.content:
            if line.startswith(b'{"record"'):
                record = json.loads(line)["record"]
        return resp.status, record


async def _get(session: aiohttp.ClientSession, url: str) -> Any:
    async with session.get(url) as resp:
        return await resp.json()


async def _history(session: aiohttp.ClientSession, url: str, rid: str) -> dict[str, Any] | None:
    """The router's record of `rid`, waiting (bounded) for the request to end."""
    for _ in range(100):
        for rec in await _get(session, f"{url}/history"):
            if rec["id"] == rid:
                return dict(rec)
        await asyncio.sleep(0.1)
    return None


async def test_a_reused_id_is_refused_after_and_during_the_first(deployment: _Run) -> None:
    assert deployment.router is not None
    url = deployment.router.url
    async with aiohttp.ClientSession() as session:
        status, rec = await _generate(session, url, id="dupA", input_tokens=1000, output_tokens=4)
        assert status == 200 and rec["status"] == "completed"
        async with asyncio.timeout(60):  # a hang is the bug: bounded, not a speed claim
            status, doc = await _generate(
                session, url, id="dupA", input_tokens=1000, output_tokens=4
            )
        assert status == 409
        assert "dupA" in doc["error"]["message"]
        async with asyncio.timeout(60):
            both = await asyncio.gather(
                *(
                    _generate(session, url, id="dupB", input_tokens=2000, output_tokens=8)
                    for _ in range(2)
                )
            )
        assert sorted(s for s, _ in both) == [200, 409]
        done = next(r for s, r in both if s == 200)
        assert done["status"] == "completed"
        records = await _get(session, f"{url}/history")
        assert [r["id"] for r in records].count("dupB") == 1
        # an id the router would assign later is taken over by nobody
        status, rec = await _generate(session, url, id="q000001", input_tokens=500, output_tokens=2)
        assert status == 200
        status, rec = await _generate(session, url, input_tokens=500, output_tokens=2)
        assert status == 200 and rec["id"] != "q000001"


async def test_client_leaving_during_a_huge_prefill_cancels_it(deployment: _Run) -> None:
    """A 10M-token prompt abandoned after 1 s must not hold the PrfaaS FIFO: the queued work is
    cancelled, the record says why, and no instance leaves rotation."""
    assert deployment.router is not None
    url = deployment.router.url
    prfaas = deployment.services["prfaas-prefill-0"]
    async with aiohttp.ClientSession() as session:
        task = asyncio.create_task(
            _generate(session, url, id="huge", input_tokens=10_000_000, output_tokens=4)
        )
        for _ in range(100):  # until the PrfaaS instance is busy with it
            if (await _get(session, f"{prfaas.url}/stats"))["running"]:
                break
            await asyncio.sleep(0.05)
        else:
            pytest.fail("the huge prompt never reached the PrfaaS prefill")
        await asyncio.sleep(1.0)
        task.cancel()  # the client goes away: its connection closes
        with pytest.raises(asyncio.CancelledError):
            await task
        rec = await _history(session, url, "huge")
        assert rec is not None and rec["status"] == "failed"
        assert rec["failure_reason"] == "client disconnected"
        assert rec["retries"] == 0
        stats: dict[str, Any] = {}
        for _ in range(100):  # the PrfaaS FIFO lets go of it
            stats = await _get(session, f"{prfaas.url}/stats")
            if not stats["running"] and stats["queued_tokens"] == 0:
                break
            await asyncio.sleep(0.1)
        assert not stats["running"] and stats["queued_tokens"] == 0, stats
        assert stats["cancelled"] == 1
        healthy = {i["id"] for i in (await _get(session, f"{url}/stats"))["instances"]}
        assert healthy == set(deployment.services) - {"router"}


async def test_client_leaving_mid_stream_blames_no_decode(deployment: _Run) -> None:
    assert deployment.router is not None
    url = deployment.router.url
    async with aiohttp.ClientSession() as session:
        async with session.post(
            f"{url}/generate", json={"id": "leaver", "input_tokens": 800, "output_tokens": 5000}
        ) as resp:
            async for line in resp.content:
                if line.startswith(b'{"tokens"'):
                    break  # first tokens arrived: leave mid-stream
            resp.close()
        rec = await _history(session, url, "leaver")
        assert rec is not None and rec["status"] == "failed", rec
        assert rec["failure_reason"] == "client disconnected"
        assert rec["retries"] == 0
        healthy = {i["id"] for i in (await _get(session, f"{url}/stats"))["instances"]}
        assert "local-decode-0" in healthy
        decode = deployment.services["local-decode-0"]
        stats: dict[str, Any] = {}
        for _ in range(100):  # its decode slot is freed, not decoded to the end
            stats = await _get(session, f"{decode.url}/stats")
            if stats["active"] == 0:
                break
            await asyncio.sleep(0.1)
        assert stats["active"] == 0 and stats["completed"] == 0, stats
        status, rec = await _generate(session, url, input_tokens=500, output_tokens=3)
        assert status == 200 and rec["status"] == "completed"
