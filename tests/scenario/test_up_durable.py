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
import contextlib
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
from testbed.services.router.recorded import KEEPER_HEADER, RecordLog, add_record_routes
from tests.processes import alive, descendants, jsonl_lines

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "tests" / "data" / "tiny.yaml"
MODEL = "internal-1t-hybrid"  # the deployment's (tiny.yaml names none): what /v1/models serves
TOKEN = "k" * 32
AUTH = {KEEPER_HEADER: TOKEN}


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


async def test_an_answer_waits_for_the_keeper_even_after_it_went_away() -> None:
    log = RecordLog(keeper_token=TOKEN)
    assert log.append(RequestRecord(id="a", input_tokens=1, output_tokens=1, arrival=0.0)) == 1
    early = asyncio.create_task(log.wait_kept(1))  # no keeper connected yet: held all the same
    await asyncio.sleep(0.1)
    assert not early.done()
    runner, url = await _serve(log)
    try:
        async with aiohttp.ClientSession(headers=AUTH) as session:
            async with session.get(f"{url}/records", params={"keep": 1}) as stream:
                first = json.loads(await stream.content.readline())
                assert first["seq"] == 1 and first["record"]["id"] == "a"
                seq = log.append(RequestRecord(id="b", input_tokens=1, output_tokens=1, arrival=1))
                waiting = asyncio.create_task(log.wait_kept(seq))
                second = json.loads(await stream.content.readline())
                assert second["seq"] == 2 and second["record"]["id"] == "b"
                await asyncio.sleep(0.1)
                assert not waiting.done()  # held until the keeper says so
                async with session.post(f"{url}/records/kept", json={"seq": 2}) as ack:
                    assert (await ack.json()) == {"kept": 2}
                async with asyncio.timeout(5):
                    assert await waiting is True and await early is True
                seq = log.append(RequestRecord(id="c", input_tokens=1, output_tokens=1, arrival=2))
                waiting = asyncio.create_task(log.wait_kept(seq))
                await asyncio.sleep(0.1)
                assert not waiting.done()
            # the keeper went away without keeping "c": the answer still waits (before, it went
            # out at once, unjournaled), until a keeper comes back and keeps it
            for _ in range(50):  # bounded: the router sees the reader leave within 0.5 s
                if not log.keepers:
                    break
                await asyncio.sleep(0.05)
            assert log.keepers == 0 and not waiting.done()
            async with session.get(f"{url}/records", params={"after": 2, "keep": 1}) as resumed:
                assert json.loads(await resumed.content.readline())["record"]["id"] == "c"
                async with session.post(f"{url}/records/kept", json={"seq": 3}) as ack:
                    assert ack.status == 200
                async with asyncio.timeout(5):
                    assert await waiting is True
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


def _up(
    out: Path, stderr: Any = subprocess.PIPE, banner: list[str] | None = None
) -> tuple[subprocess.Popen[str], str]:
    """`testbed up` on the tiny deployment; returns it and its OpenAI base URL (and puts the
    banner's lines in `banner`)."""
    cmd = [sys.executable, "-m", "testbed.cli", "up", str(TINY), "--out", str(out), "--no-faults"]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=stderr, text=True)
    assert proc.stdout is not None
    base = None
    for _ in range(60):  # bounded: the banner is a handful of lines
        line = proc.stdout.readline()
        if banner is not None:
            banner.append(line)
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
    body: dict[str, Any] = {"model": MODEL, "max_tokens": 3 + i % 3, "stream": stream}
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


def _service_pid(parent: int, banner: list[str], sid: str) -> int:
    """The pid of the runner's service that serves `sid`: the one listening on the port of its
    metrics URL in the banner (`metrics SID: http://127.0.0.1:PORT/metrics`)."""
    url = next(line.split(": ", 1)[1] for line in banner if line.startswith(f"metrics {sid}:"))
    port = int(url.split(":")[2].split("/")[0])
    inodes = set()
    for row in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        cols = row.split()
        if int(cols[1].split(":")[1], 16) == port and cols[3] == "0A":  # LISTEN
            inodes.add(f"socket:[{cols[9]}]")
    for pid in descendants(parent):
        with contextlib.suppress(FileNotFoundError, PermissionError):
            for fd in Path(f"/proc/{pid}/fd").iterdir():
                with contextlib.suppress(FileNotFoundError):
                    if os.readlink(fd) in inodes:
                        return pid
    raise AssertionError(f"no process listens for {sid} on port {port}")


async def _stalled(router: str, tasks: list[asyncio.Task[str]]) -> dict[str, Any]:
    """Wait (bounded) until the router holds every answer for the stopped keeper and says the
    keeper stalled, or until the clients are done (what happened before: answers went out
    unjournaled after 2 s); returns the router's last keeper state."""
    keeper: dict[str, Any] = {}
    async with aiohttp.ClientSession() as session:
        for _ in range(300):  # up to ~60 s
            with contextlib.suppress(aiohttp.ClientError, KeyError, ValueError):
                async with session.get(f"{router}/stats") as resp:
                    keeper = (await resp.json())["keeper"]
                if keeper["stalled"] and keeper["answers_held"] == len(tasks):
                    return keeper
            if all(t.done() for t in tasks):
                return keeper
            await asyncio.sleep(0.2)
    return keeper


@pytest.mark.slow
def test_a_stalled_then_killed_runner_loses_no_record_a_client_saw_end(tmp_path: Path) -> None:
    """A SIGKILL keeps every record a client saw end, the runner's services go with it and no
    summary is half-written. Issue 33, defect 6: with the runner stopped (SIGSTOP) the router
    used to release answers after 2 s unjournaled, so a SIGKILL then lost records clients had
    seen complete (6 of 9). Now the answers wait for the keeper: none completes while it is
    stopped, the router says the keeper stalled, and every record a client saw end is in
    requests.jsonl (the ones before the stop too: killed with no time to catch up)."""
    proc, base = _up(tmp_path)
    router = base.removesuffix("/v1")
    n = 9

    async def scenario() -> tuple[list[str], dict[str, Any], list[str | BaseException]]:
        before = await _clients(base, 8)  # the keeper works: these are journaled
        os.kill(proc.pid, signal.SIGSTOP)
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:
            tasks = [asyncio.create_task(_one(session, base, i)) for i in range(n)]
            keeper = await _stalled(router, tasks)
            os.kill(proc.pid, signal.SIGKILL)  # stopped, then killed: no chance to catch up
            outcomes = await asyncio.gather(*tasks, return_exceptions=True)
        return before, keeper, list(outcomes)

    try:
        children = descendants(proc.pid)
        assert len(children) >= 5  # the zygote, the router, three workers (and the link emulator)
        before, keeper, outcomes = asyncio.run(scenario())
        proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGCONT)
            proc.kill()
    assert not _wait_gone(children), "services outlived their runner"
    records = jsonl_lines(tmp_path / "requests.jsonl")  # every line parses
    journaled = {str(r["id"]) for r in records}
    seen_end = [o for o in outcomes if isinstance(o, str)]
    assert len(set(before)) == 8 and set(before) <= journaled
    assert all(r["status"] == "completed" for r in records)
    assert not (tmp_path / "summary.json").exists()  # never half-written: absent
    assert set(seen_end) <= journaled, f"{len(set(seen_end) - journaled)} of {n} lost"
    assert keeper.get("stalled") and keeper.get("answers_held") == n  # held, and it shows
    assert not seen_end  # none ended while the keeper was stopped
    assert "keeper stalled" in (tmp_path / "logs" / "router.log").read_text()  # one line


def _wait_line(path: Path, line: str) -> None:
    for _ in range(150):  # up to ~30 s: the runner looks every second
        if line in path.read_text():
            return
        time.sleep(0.2)


@pytest.mark.slow
def test_a_stalled_runner_resumes_and_a_worker_killed_from_outside_are_reported(
    tmp_path: Path,
) -> None:
    """The other side of the hold: once the stopped runner continues, it journals the held
    records, their answers go out, and it prints that the router held answers for it. Then
    (issue 33, defect 7) a worker SIGKILLed from outside is a console line at once and a note in
    the exit report (and report.md). One `testbed up` for both: the suite's budget."""
    err_path = tmp_path / "stderr.txt"
    with err_path.open("w") as err:
        banner: list[str] = []
        proc, base = _up(tmp_path / "out", stderr=err, banner=banner)
        router = base.removesuffix("/v1")

        async def scenario() -> tuple[dict[str, Any], list[str]]:
            os.kill(proc.pid, signal.SIGSTOP)
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as s:
                tasks = [asyncio.create_task(_one(s, base, i)) for i in range(4)]
                keeper = await _stalled(router, tasks)
                os.kill(proc.pid, signal.SIGCONT)
                return keeper, list(await asyncio.gather(*tasks))

        try:
            keeper, ids = asyncio.run(scenario())
            line = "this runner's journal stalled: the router held answers"
            _wait_line(err_path, line)
            os.kill(_service_pid(proc.pid, banner, "local-decode-0"), signal.SIGKILL)
            died = "service local-decode-0 died (killed by SIGKILL)"
            _wait_line(err_path, died)
            assert died in err_path.read_text()
            proc.send_signal(signal.SIGTERM)
            out, _ = proc.communicate(timeout=120)
        finally:
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGCONT)
                proc.kill()
    assert keeper.get("stalled") and keeper.get("answers_held") == 4
    assert line in err_path.read_text()
    assert "note: the keeper stalled 1 time(s)" in out
    journaled = {str(r["id"]) for r in jsonl_lines(tmp_path / "out" / "requests.jsonl")}
    assert set(ids) <= journaled and len(set(ids)) == 4
    note = "service local-decode-0 dead at exit: it died (killed by SIGKILL)"
    assert f"note: {note}" in out
    assert note in (tmp_path / "out" / "report.md").read_text()
