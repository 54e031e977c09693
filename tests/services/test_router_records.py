"""The router's record log under a keeper (issue 33, defects 6 and 7): the keeper's routes need
the run's token, `seq` cannot run ahead of the records, answers wait for the keeper however long
it takes (and a stalled keeper shows), kept records are dropped beyond a tail with a 410 for
whoever asks for them, `/history` comes a page at a time, and the ids the router assigns cost
no memory while every id stays refused on reuse."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from testbed.metrics.records import RequestRecord
from testbed.services.router import recorded
from testbed.services.router.api import create_app
from testbed.services.router.ids import RequestIds
from testbed.services.router.intake import STATE
from testbed.services.router.recorded import KEEPER_HEADER, RecordLog
from testbed.services.spec import ServiceSpec

pytestmark = pytest.mark.timeout(60)

TOKEN = "t" * 32
AUTH = {KEEPER_HEADER: TOKEN}


def _rec(i: int) -> RequestRecord:
    return RequestRecord(id=f"r{i}", input_tokens=1, output_tokens=1, arrival=float(i))


async def _router(**kw: Any) -> tuple[TestClient[Any, Any], RecordLog]:
    app, _ = await create_app(ServiceSpec(role="router", id="r", **kw))
    client: TestClient[Any, Any] = TestClient(TestServer(app))
    await client.start_server()
    return client, app[STATE].record_log


async def test_the_keepers_routes_need_the_runs_token() -> None:
    client, log = await _router(keeper_token=TOKEN)
    try:
        log.append(_rec(1))
        for headers in ({}, {KEEPER_HEADER: "x" * 32}):
            resp = await client.get("/records", params={"keep": 1}, headers=headers)
            assert resp.status == 403
            resp = await client.post("/records/kept", json={"seq": 1}, headers=headers)
            assert resp.status == 403
        assert log.kept == 0 and log.holds  # a token: answers wait for a keeper
        resp = await client.post("/records/kept", json={"seq": 10**15}, headers=AUTH)
        assert resp.status == 400 and log.kept == 0  # not "every answer released at once"
        resp = await client.post("/records/kept", json={"seq": 2}, headers=AUTH)
        assert resp.status == 400  # one above the last record made
        resp = await client.post("/records/kept", json={"seq": 1}, headers=AUTH)
        assert (await resp.json()) == {"kept": 1}
        async with client.get("/records") as plain:  # a reader that keeps nothing: allowed
            line = json.loads(await plain.content.readline())
            assert line["seq"] == 1 and line["record"]["id"] == "r1"
    finally:
        await client.close()


async def test_without_a_token_no_reader_can_be_a_keeper() -> None:
    client, log = await _router()  # `testbed run`: nothing waits for anyone
    try:
        resp = await client.get("/records", params={"keep": 1}, headers=AUTH)
        assert resp.status == 403
        log.append(_rec(1))
        async with asyncio.timeout(5):
            assert await log.wait_kept(1) is False
    finally:
        await client.close()


async def test_an_answer_waits_for_its_keeping_however_long_and_a_stall_shows(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(recorded, "KEEPER_STALL_S", 0.05)
    client, log = await _router(keeper_token=TOKEN)
    try:
        async with client.get("/records", params={"keep": 1}, headers=AUTH) as stream:
            seq = log.append(_rec(1))
            waiting = asyncio.create_task(log.wait_kept(seq))
            assert json.loads(await stream.content.readline())["seq"] == 1
        # the keeper went away without keeping it: the answer still waits (it never goes out
        # unkept), and the router says the keeper stalled
        for _ in range(200):
            stats = (await (await client.get("/stats")).json())["keeper"]
            if stats["stalled"] and stats["connected"] == 0:
                break
            await asyncio.sleep(0.02)
        assert stats["stalled"] and stats["answers_held"] == 1 and stats["stalls"] == 1
        assert not waiting.done()
        resp = await client.post("/records/kept", json={"seq": 1}, headers=AUTH)
        assert resp.status == 200
        async with asyncio.timeout(5):
            assert await waiting is True
        stats = (await (await client.get("/stats")).json())["keeper"]
        assert not stats["stalled"] and stats["answers_held"] == 0 and stats["kept"] == 1
    finally:
        await client.close()


async def test_kept_records_are_dropped_beyond_the_tail_and_asking_for_them_is_410(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(recorded, "TRIM_CHUNK", 2)
    client, log = await _router(keeper_token=TOKEN)
    log.tail = 3
    try:
        for i in range(1, 9):
            log.append(_rec(i))
        assert (await client.get("/history")).status == 200  # nothing kept: nothing dropped
        log.mark_kept(4)  # 1..4 on disk: 1 dropped (4 kept, 3 of them beyond the tail of 3..)
        assert log.first > 1 and log.first <= 5 and len(log.held) >= 4
        first = log.first
        for path in ("/history", "/records"):
            resp = await client.get(path, params={"after": first - 2})
            assert resp.status == 410
            assert (await resp.json())["first_seq"] == first
        page = await (await client.get("/history", params={"after": first - 1})).json()
        assert [r["id"] for r in page] == [f"r{i}" for i in range(first, 9)]
        stats = await (await client.get("/stats")).json()
        assert stats["recorded"] == 8 and stats["keeper"]["first_held_seq"] == first
        log.mark_kept(8)
        assert len(log.held) >= 3 and log.first + len(log.held) == 9  # the tail stays
    finally:
        await client.close()


async def test_history_comes_a_page_at_a_time() -> None:
    client, log = await _router()
    try:
        for i in range(1, 6):
            log.append(_rec(i))
        page = await (await client.get("/history", params={"limit": 2})).json()
        assert [r["id"] for r in page] == ["r1", "r2"]
        page = await (await client.get("/history", params={"after": 4, "limit": 2})).json()
        assert [r["id"] for r in page] == ["r5"]  # shorter than the limit: the last page
        assert len(await (await client.get("/history")).json()) == 5
        for bad in ("0", "10001", "x", "1" * 30):
            assert (await client.get("/history", params={"limit": bad})).status == 400
        assert (await client.get("/history", params={"after": "²"})).status == 400
    finally:
        await client.close()


def test_ids_the_router_assigns_cost_nothing_and_every_id_is_refused_on_reuse() -> None:
    ids = RequestIds()
    assert ids.claim("q000003")  # a client's id in the router's own form: skipped later
    assert ids.claim("mine")
    mine = []
    for _ in range(5):
        rid = ids.fresh()
        assert ids.claim(rid)
        mine.append(rid)
    assert mine == ["q000001", "q000002", "q000004", "q000005", "q000006"]
    assert ids.chosen == {"q000003", "mine"}  # only what clients chose is kept one by one
    for rid in [*mine, "q000003", "mine"]:
        assert rid in ids and not ids.claim(rid)
    assert ids.claim("q0000007") and ids.claim("q7")  # not the router's form: clients' ids
    assert "q000007" not in ids and ids.claim(ids.fresh())
