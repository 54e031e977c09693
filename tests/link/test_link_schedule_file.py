"""Bandwidth schedules from hostile input (item 7): a schedule_file is read off the event loop,
bounded in size and time, must be a regular file, and its content never comes back in an
error; steps and periods shorter than the minimum spacing are refused instead of spinning the
loop."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from testbed.link import schedule as schedule_mod
from testbed.link.client import LinkApiError, LinkClient
from testbed.link.schedule import MAX_FILE_BYTES, MIN_STEP_SECONDS, Schedule, ScheduleError

pytestmark = pytest.mark.timeout(60)


async def _add(c: LinkClient, **attrs: Any) -> dict[str, Any]:
    return await c.add_toxic("p", "link_bandwidth", name="trace", attributes=attrs)


async def _refused(c: LinkClient, **attrs: Any) -> str:
    with pytest.raises(LinkApiError) as info:
        await _add(c, **attrs)
    assert info.value.status == 400, info.value
    assert "\n" not in info.value.message
    return info.value.message


@pytest.fixture
async def proxy(client: LinkClient) -> LinkClient:
    await client.create_proxy("p", upstream="127.0.0.1:9")
    return client


def _hold_fifo_open(path: Path, seconds: float, stop: threading.Event) -> None:
    """Act as a slow writer: once a reader opens the FIFO, keep it open for `seconds`."""
    deadline = time.monotonic() + seconds
    while not stop.is_set() and time.monotonic() < deadline:
        try:
            fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
        except OSError as exc:
            if exc.errno != errno.ENXIO:  # ENXIO: no reader yet
                raise
            time.sleep(0.01)
            continue
        try:
            stop.wait(max(0.0, deadline - time.monotonic()))
            with contextlib.suppress(OSError):
                os.write(fd, b"0 100\n")
        finally:
            os.close(fd)
        return


async def test_fifo_is_refused_at_once(proxy: LinkClient, tmp_path: Path) -> None:
    fifo = tmp_path / "trace.fifo"
    os.mkfifo(fifo)
    stop = threading.Event()
    writer = threading.Thread(target=_hold_fifo_open, args=(fifo, 3.0, stop), daemon=True)
    writer.start()
    try:
        msg = await _refused(proxy, schedule_file=str(fifo))
    finally:
        stop.set()
        writer.join(10)
    assert str(fifo) in msg and "not a regular file" in msg


async def test_device_is_refused(proxy: LinkClient) -> None:
    msg = await _refused(proxy, schedule_file="/dev/zero")
    assert "/dev/zero" in msg and "not a regular file" in msg


async def test_oversized_file_is_refused(proxy: LinkClient, tmp_path: Path) -> None:
    big = tmp_path / "big.csv"
    with big.open("wb") as f:
        f.truncate(MAX_FILE_BYTES + 1)  # sparse: no disk, no memory
    msg = await _refused(proxy, schedule_file=str(big))
    assert str(big) in msg and "larger than" in msg


async def test_slow_read_times_out_off_the_loop(
    proxy: LinkClient, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A read that never finishes gets a 400 after the time bound while the loop keeps going."""
    f = tmp_path / "trace.csv"
    f.write_text("0 100\n")
    release = threading.Event()

    def stuck_read(path: str, limit: int) -> bytes:
        release.wait(30)  # a filesystem that does not answer
        return b"0 100\n"

    monkeypatch.setattr(schedule_mod, "_read_bounded", stuck_read)
    monkeypatch.setattr(schedule_mod, "FILE_TIMEOUT", 0.5)
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.01)
            ticks += 1

    task = asyncio.create_task(ticker())
    try:
        msg = await _refused(proxy, schedule_file=str(f))
    finally:
        task.cancel()
        release.set()
    assert str(f) in msg and "timed out" in msg
    assert ticks >= 5  # the event loop ran while the file was being read


@pytest.mark.parametrize(
    ("content", "line"),
    [
        (
            "root:x:0:0:root:/root:/bin/bash\ndaemon:x:1:1:SECRET:/usr/sbin:/usr/sbin/nologin\n",
            2,
        ),
        ("time,rate\n0 100\nSECRET 200\n", 3),
        ("0 100\n1 SECRET\n", 2),
        ("0 100\n1 200 SECRET\n", 2),
        ("0 100\n1 -5SECRET\n", 2),
        ("0 100\n1SECRET 5\n", 2),
    ],
)
async def test_errors_name_the_line_not_its_content(
    proxy: LinkClient, tmp_path: Path, content: str, line: int
) -> None:
    f = tmp_path / "trace.csv"
    f.write_text(content)
    msg = await _refused(proxy, schedule_file=str(f))
    assert str(f) in msg and f"line {line}" in msg, msg
    assert "SECRET" not in msg and "daemon" not in msg and "nologin" not in msg, msg


async def test_file_with_close_steps_is_refused(proxy: LinkClient, tmp_path: Path) -> None:
    f = tmp_path / "trace.csv"
    f.write_text("0 100\n0.0000001 200\n")
    msg = await _refused(proxy, schedule_file=str(f))
    assert "apart" in msg


async def test_a_good_file_still_loads(proxy: LinkClient, tmp_path: Path) -> None:
    f = tmp_path / "trace.csv"
    f.write_text("time,rate\n0 100\n0.5 200\n")
    t = await _add(proxy, schedule_file=str(f), period=1)
    assert t["attributes"]["schedule_file"] == str(f)


@pytest.mark.parametrize(
    "attrs",
    [
        {"schedule": [[0, 100]], "period": 2e-9},
        {"schedule": [[0, 100], [1e-9, 200]]},
        {"schedule": [[0, 100], [1, 200]], "period": 1.0000001},  # wraps around too fast
    ],
)
async def test_steps_closer_than_the_minimum_are_refused(
    proxy: LinkClient, attrs: dict[str, Any]
) -> None:
    msg = await _refused(proxy, **attrs)
    assert f"{MIN_STEP_SECONDS:g}" in msg, msg


def test_schedule_spacing_unit() -> None:
    with pytest.raises(ScheduleError, match="period"):
        Schedule([(0.0, 1.0)], initial=1.0, period=2e-9)
    with pytest.raises(ScheduleError, match="apart"):
        Schedule([(0.0, 1.0), (MIN_STEP_SECONDS / 2, 2.0)], initial=1.0)
    ok = Schedule([(0.0, 1.0), (MIN_STEP_SECONDS, 2.0)], initial=1.0, period=2 * MIN_STEP_SECONDS)
    assert ok.next_change(0.0) == MIN_STEP_SECONDS
    # the same time twice is one step (the later one wins), not a 0 s gap
    assert Schedule([(1.0, 1.0), (1.0, 2.0)], initial=5.0).rate_at(1.5) == 2.0
