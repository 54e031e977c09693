"""Long text prompts are sized off the event loop, for real (issue #33, defect 4): in a worker
process of a bounded pool (services.tokenize_pool), never in the router's own process; a prompt
above the token cap is a 400, one beyond the queue a 503; a client that leaves while its prompt
waits or is tokenized leaves a record, and a waiting prompt is taken out of the queue; idle
workers are stopped (their memory returned). The chunked tokenizing gives exactly the whole
text's ids and hashes.

In-process router on loopback (aiohttp test server, handler cancellation on as the services
run). A gate holds a prompt in its worker until the test opens it, so what is checked is
ordering, not speed: /v1/models answers while a prompt is held mid-tokenization.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import random
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from testbed.services import openai_request, tokenize_pool, tokenizer
from testbed.services.spec import ServiceSpec
from testbed.services.tokenize_pool import TokenizePool
from testbed.services.tokenizer import block_hashes, codec, measure_text, pieces

GATE_WAIT_S = 60.0
"""Longest a gated prompt waits for its gate (a bound on a broken test, not a speed claim)."""


def gated_measure(text: str, cap: int) -> tuple[int, tuple[int, ...]]:
    """measure_text, once the file named by the prompt's second word exists (in the worker)."""
    gate = Path(text.split(" ", 2)[1])
    deadline = time.monotonic() + GATE_WAIT_S
    while not gate.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    return measure_text(text, cap)


def _prompt(gate: Path, words: int = 2000) -> str:
    return f"GATE {gate} " + codec().filler_text(0, words)


@pytest.fixture
def pool(monkeypatch: pytest.MonkeyPatch) -> Iterator[TokenizePool]:
    """One worker, one waiting place: the third prompt at once is refused."""
    p = TokenizePool(workers=1, queue=1, idle_s=0.3)
    monkeypatch.setattr(tokenize_pool, "_POOL", p)
    monkeypatch.setattr(openai_request, "measure_text", gated_measure)
    yield p
    p.close()


@pytest.fixture
async def router() -> AsyncIterator[TestClient]:
    # imported here: a worker process imports this module (gated_measure), not the router
    from testbed.services.router import create_app
    from testbed.services.router.intake import STATE

    spec = ServiceSpec(role="router", id="router", time_scale=1000)
    app, _ = await create_app(spec)
    app[STATE].no_route_wait_s = 0.0  # no instances: a sized prompt fails at once
    client = TestClient(TestServer(app, host="127.0.0.1", handler_cancellation=True))
    await client.start_server()
    try:
        yield client
    finally:
        await client.close()


async def _until(cond: Any, what: str) -> None:
    for _ in range(3000):  # bounded: 60 s at most
        if cond():
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"never: {what}")


async def _post(client: TestClient, body: dict[str, Any]) -> tuple[int, Any]:
    async with client.post("/v1/completions", json=body) as resp:
        return resp.status, await resp.json(content_type=None)


async def _history(client: TestClient) -> list[dict[str, Any]]:
    async with client.get("/history") as resp:
        return list(await resp.json())


async def test_a_prompt_held_in_its_worker_leaves_the_router_serving(
    router: TestClient, pool: TokenizePool, tmp_path: Path
) -> None:
    gate = tmp_path / "open"
    held = asyncio.create_task(_post(router, {"prompt": _prompt(gate), "max_tokens": 2}))
    await _until(lambda: pool.running == 1, "the prompt reached a worker")
    async with router.get("/v1/models") as resp:  # answered while the prompt tokenizes
        assert resp.status == 200
    async with router.get("/stats") as resp:
        assert resp.status == 200
    assert not held.done()
    gate.touch()
    await asyncio.wait_for(held, GATE_WAIT_S)
    (rec,) = await _history(router)
    assert rec["input_tokens"] > 2000  # sized; then no instance took it (this router has none)
    assert pool.jobs == 1
    worker = await pool.run(os.getpid)
    assert worker != os.getpid()  # the work ran in another process


async def test_beyond_the_queue_is_a_503_and_the_queue_drains(
    router: TestClient, pool: TokenizePool, tmp_path: Path
) -> None:
    gate = tmp_path / "open"
    first = asyncio.create_task(_post(router, {"prompt": _prompt(gate), "max_tokens": 2}))
    await _until(lambda: pool.running == 1, "the first prompt reached the worker")
    second = asyncio.create_task(_post(router, {"prompt": _prompt(gate), "max_tokens": 2}))
    await _until(lambda: pool.waiting == 1, "the second prompt waits")
    status, doc = await _post(router, {"prompt": _prompt(gate), "max_tokens": 2})
    assert status == 503
    assert doc["error"]["type"] == "server_error" and "busy" in doc["error"]["message"]
    gate.touch()
    await asyncio.wait_for(asyncio.gather(first, second), GATE_WAIT_S)
    assert pool.jobs == 2 and pool.running == 0 and pool.waiting == 0
    sized = [r["input_tokens"] for r in await _history(router)]  # the refused one: no record
    assert len(sized) == 2 and min(sized) > 2000  # both sized (then no instance took them)


async def test_a_client_that_leaves_mid_tokenization_leaves_a_record(
    router: TestClient, pool: TokenizePool, tmp_path: Path
) -> None:
    gate = tmp_path / "open"
    running = asyncio.create_task(_post(router, {"prompt": _prompt(gate), "max_tokens": 3}))
    await _until(lambda: pool.running == 1, "the first prompt reached the worker")
    queued = asyncio.create_task(_post(router, {"prompt": _prompt(gate), "max_tokens": 4}))
    await _until(lambda: pool.waiting == 1, "the second prompt waits")
    for task in (running, queued):
        task.cancel()  # the client goes away: its connection closes
    await asyncio.gather(running, queued, return_exceptions=True)
    await _until(lambda: pool.waiting == 0, "the waiting prompt left the queue")
    assert pool.running == 1  # the held one is still in its worker: the queued one never ran
    await _until(lambda: pool.dropped == 2, "both prompts dropped")
    recs = await _history(router)
    assert sorted(r["output_tokens"] for r in recs) == [3, 4]
    for rec in recs:
        assert rec["status"] == "failed" and rec["failure_reason"] == "client disconnected"
        assert rec["input_tokens"] == 0 and rec["route"] is None
    assert len({r["id"] for r in recs}) == 2
    gate.touch()
    await _until(lambda: pool.running == 0, "the held prompt ended")
    assert pool.jobs == 1


async def test_above_the_token_cap_is_a_400(
    router: TestClient, pool: TokenizePool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(openai_request, "MAX_PROMPT_TOKENS", 1000)
    (tmp_path / "open").touch()
    for body in (
        {"prompt": _prompt(tmp_path / "open", 2000)},
        {"prompt": list(range(1001))},
    ):
        status, doc = await _post(router, {**body, "max_tokens": 2})
        assert status == 400, doc
        assert "at most 1000" in doc["error"]["message"]
    async with router.post(
        "/v1/chat/completions",
        json={"messages": [{"role": "user", "content": _prompt(tmp_path / "open", 2000)}]},
    ) as resp:
        assert resp.status == 400
    assert await _history(router) == []  # refused: no record, no id used


async def test_idle_workers_are_stopped_and_started_again() -> None:
    p = TokenizePool(workers=1, queue=1, idle_s=0.2)
    try:
        first = await p.run(os.getpid)
        await _until(lambda: not p.started, "the idle workers stopped")
        assert p.retired == 1
        await _until(lambda: not _alive(first), "the worker process exited")
        second = await p.run(os.getpid)
        assert second not in (first, os.getpid())
    finally:
        p.close()


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _reference_hashes(ids: list[int], block: int = 512) -> tuple[int, ...]:
    """block_hashes as it was first written (one token at a time)."""
    out, parent = [], b""
    for start in range(0, len(ids), block):
        h = hashlib.blake2b(digest_size=8)
        h.update(parent)
        h.update(b"".join(int(t).to_bytes(4, "little") for t in ids[start : start + block]))
        parent = h.digest()
        out.append(int.from_bytes(parent, "little", signed=True))
    return tuple(out)


def test_pieces_tokenize_exactly_as_the_whole_text(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(7)
    alphabet = [*"abcXYZ019 .,'!?-<|>\n\t", "  ", " 's", "é", "中", "\U0001f600", "\u00a0",
                "<|endoftext|>"]  # fmt: skip
    c = codec()
    for _ in range(60):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 1500)))
        size = rng.randint(1, 200)
        parts = list(pieces(text, size))
        assert "".join(parts) == text
        ids = c.encode(text)
        assert [i for p in parts for i in c.encode(p)] == ids
        assert block_hashes(ids) == _reference_hashes(ids)
    monkeypatch.setattr(tokenizer, "CHUNK_CHARS", 1000)  # many pieces
    long = codec().filler_text(0, 6000)
    n, hashes = measure_text(long, 1 << 20)
    assert n == len(c.encode(long)) == 6000 and hashes == _reference_hashes(c.encode(long))
    assert measure_text(long, 100)[0] > 100  # past the cap: counting stops, no hashes
    assert measure_text(long, 100)[1] == ()
    assert measure_text("", 10) == (1, block_hashes([0]))


_SERVER = """
import asyncio, os, sys
from testbed.services.tokenize_pool import TokenizePool
async def main():
    pool = TokenizePool(workers=2)
    pids = await asyncio.gather(pool.run(os.getpid), pool.run(os.getpid))
    print(" ".join(str(p) for p in pids), flush=True)
    await asyncio.sleep(60)
asyncio.run(main())
"""


@pytest.mark.parametrize("how", ["SIGKILL", "os._exit"])
def test_the_pool_dies_with_its_server(how: str) -> None:
    """A server that dies without shutting its pool down (SIGKILL; os._exit, as services.host
    leaves) leaves no worker and no fork server: before, both waited forever."""
    import signal
    import subprocess
    import sys

    code = (
        _SERVER if how == "SIGKILL" else _SERVER.replace("await asyncio.sleep(60)", "os._exit(0)")
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        workers = [int(p) for p in proc.stdout.readline().split()]
        assert len(workers) >= 1 and proc.pid not in workers
        with open(f"/proc/{workers[0]}/stat") as f:
            forkserver = int(f.read().split(") ", 1)[1].split()[1])  # the worker's parent
        if how == "SIGKILL":
            proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and any(map(_alive, [*workers, forkserver])):
            time.sleep(0.1)
        assert not [p for p in [*workers, forkserver] if _alive(p)]
    finally:
        proc.kill()
        proc.wait()
