"""`testbed up` keeps every request any client sent, whatever ends it (issue #17 leftovers).

The runner follows the router's `GET /records` as a keeper (services.router.recorded): each
record goes into requests.jsonl through run's journal as it ends, and the router holds the
answer's last bytes until the keeper says it is on disk. So a SIGKILL right after the clients
have seen their requests end still finds every one of them in the journal, and SIGTERM / SIGINT
write all the results. Real processes on loopback; assertions are about files and processes,
as tests/scenario/test_durable_results.py does for `run`.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from testbed.metrics.records import RequestRecord
from testbed.services.router.recorded import RecordLog, add_record_routes
from tests.processes import alive, jsonl_lines
from tests.processes import children as child_pids

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "tests" / "data" / "tiny.yaml"


# ------------------------------------------------------------------ the router's record log


async def _serve(log: RecordLog) -> tuple[web.AppRunner, str]:
    app = web.Application()
    add_record_routes(app, log)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, f"http://127.0.0.1:{port}"


async def test_an_answer_waits_for_the_keeper_and_only_while_one_is_connected() -> None:
    log = RecordLog()
    assert log.append(RequestRecord(id="a", input_tokens=1, output_tokens=1, arrival=0.0)) == 1
    async with asyncio.timeout(5):  # bounds a hang: no keeper, nothing waits
        assert await log.wait_kept(1) is False
    runner, url = await _serve(log)
    try:
        async with aiohttp.ClientSession() as session:
            async with session.get(f"{url}/records", params={"keep": 1}) as stream:
                first = json.loads(await stream.content.readline())
                assert first["seq"] == 1 and first["record"]["id"] == "a"
                seq = log.append(RequestRecord(id="b", input_tokens=1, output_tokens=1, arrival=1))
                waiting = asyncio.create_task(log.wait_kept(seq, timeout_s=60))
                second = json.loads(await stream.content.readline())
                assert second["seq"] == 2 and second["record"]["id"] == "b"
                await asyncio.sleep(0.1)
                assert not waiting.done()  # held until the keeper says so
                async with session.post(f"{url}/records/kept", json={"seq": 2}) as ack:
                    assert (await ack.json()) == {"kept": 2}
                async with asyncio.timeout(5):
                    assert await waiting is True
                seq = log.append(RequestRecord(id="c", input_tokens=1, output_tokens=1, arrival=2))
                waiting = asyncio.create_task(log.wait_kept(seq, timeout_s=60))
                await asyncio.sleep(0.1)
                assert not waiting.done()
            # the keeper went away without keeping "c": the answer goes out anyway
            async with asyncio.timeout(5):
                assert await waiting is False
            async with session.get(f"{url}/records", params={"after": 2}) as resumed:
                assert json.loads(await resumed.content.readline())["record"]["id"] == "c"
                await log.close()  # the router stops: the stream ends
                assert await resumed.content.read() == b""
            async with session.get(f"{url}/records", params={"after": "x"}) as bad:
                assert bad.status == 400
    finally:
        await runner.cleanup()


# ------------------------------------------------------------------ testbed up, killed


def _wait_gone(pids: set[int]) -> set[int]:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(alive(p) for p in pids):
        time.sleep(0.1)
    return {p for p in pids if alive(p)}


def _up(out: Path) -> tuple[subprocess.Popen[str], str]:
    """`testbed up` on the tiny deployment; returns it and its OpenAI base URL."""
    cmd = [sys.executable, "-m", "testbed.cli", "up", str(TINY), "--out", str(out), "--no-faults"]
    proc = subprocess.Popen(
        cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    base = None
    for _ in range(60):  # bounded: the banner is a handful of lines
        line = proc.stdout.readline()
        if line.startswith("OpenAI base URL:"):
            base = line.split(":", 1)[1].strip()
        if not line or line.startswith("serving at"):
            break
    if base is None:
        proc.kill()
        pytest.fail(f"no banner: {proc.communicate(timeout=30)}")
    return proc, base


async def _one(session: aiohttp.ClientSession, base: str, i: int) -> str:
    """One request, of the four kinds in turn, read to its end; returns the router's id."""
    chat, stream = bool(i & 1), bool(i & 2)
    body: dict[str, Any] = {"model": "m", "max_tokens": 3 + i % 3, "stream": stream}
    if chat:
        body["messages"] = [{"role": "user", "content": f"request {i}"}]
    else:
        body["prompt"] = f"request {i} of the durable test"
    url = f"{base}/{'chat/completions' if chat else 'completions'}"
    async with session.post(url, json=body) as resp:
        assert resp.status == 200, await resp.text()
        if not stream:
            cid = str((await resp.json())["id"])
        else:
            events = [line async for line in resp.content if line.startswith(b"data: ")]
            assert events[-1].strip() == b"data: [DONE]"
            cid = str(json.loads(events[0][len(b"data: ") :])["id"])
    return cid.split("-", 1)[1]  # cmpl-ID / chatcmpl-ID: the record's id


async def _clients(base: str, n: int) -> list[str]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:
        return list(await asyncio.gather(*(_one(session, base, i) for i in range(n))))


@pytest.mark.slow
def test_sigkill_keeps_every_record_a_client_saw_end(tmp_path: Path) -> None:
    proc, base = _up(tmp_path)
    try:
        children = child_pids(proc.pid)
        assert len(children) >= 4  # the router, three workers (and the link emulator)
        ids = asyncio.run(_clients(base, 8))
        os.kill(proc.pid, signal.SIGKILL)  # at once: no time to catch up after the answers
        proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert not _wait_gone(children), "services outlived their runner"
    records = jsonl_lines(tmp_path / "requests.jsonl")  # every line parses
    assert len(set(ids)) == 8
    assert set(ids) <= {str(r["id"]) for r in records}
    assert all(r["status"] == "completed" for r in records)
    assert not (tmp_path / "summary.json").exists()  # never half-written: absent


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_sigterm_and_sigint_write_every_record(tmp_path: Path, sig: signal.Signals) -> None:
    proc, base = _up(tmp_path)
    try:
        ids = asyncio.run(_clients(base, 4))
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err  # a standing deployment ends this way: the checkers' code
    records = jsonl_lines(tmp_path / "requests.jsonl")
    assert sorted(str(r["id"]) for r in records) == sorted(ids)
    arrivals = [float(r["arrival"]) for r in records]
    assert arrivals == sorted(arrivals)  # the final file is ordered by arrival
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["requests"]["submitted"] == summary["requests"]["completed"] == 4
    assert f"stopped by {sig.name}" in (tmp_path / "report.md").read_text()
    assert jsonl_lines(tmp_path / "history.jsonl")
