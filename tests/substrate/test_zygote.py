"""The service zygote (testbed.services.zygote, testbed.substrate.zygote): a run's services are
forked from one process that imported every role's app, behave as spawned ones do (ports,
logs, signals, exit codes, restarts), and none outlives the zygote."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
from pathlib import Path

import aiohttp
import pytest

from testbed.errors import UserError
from testbed.services.spec import ServiceSpec
from testbed.substrate.local import LocalSubstrate

pytestmark = pytest.mark.timeout(60)


def _spec(role: str, sid: str, **kw: object) -> ServiceSpec:
    return ServiceSpec(role=role, id=sid, hardware="h20x8", time_scale=1000, **kw)  # type: ignore[arg-type]


def _parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


async def test_services_are_forked_by_one_zygote_and_serve(tmp_path: Path) -> None:
    sub = LocalSubstrate(tmp_path)
    await sub.warm(["decode", "prefill"], None, seed=1)
    assert sub.zygote is not None
    zygote = sub.zygote.proc.pid
    try:
        decode, prefill = await asyncio.gather(
            sub.start_service(_spec("decode", "d0")), sub.start_service(_spec("prefill", "p0"))
        )
        pids = {decode.ref.pid, prefill.ref.pid}  # type: ignore[attr-defined]
        assert {_parent(p) for p in pids} == {zygote}
        assert all(os.getsid(p) == p for p in pids)  # each in its own session
        async with aiohttp.ClientSession() as s:
            for h in (decode, prefill):
                async with s.get(f"{h.url}/metrics") as r:
                    assert r.status == 200
    finally:
        await sub.stop_all()
    # a service leaves with status 0 on SIGTERM (services.host skips the interpreter's teardown)
    assert [h.ref.proc.returncode for h in (decode, prefill)] == [0, 0]  # type: ignore[attr-defined]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d0.log", "p0.log"]
    with pytest.raises(ProcessLookupError):
        os.kill(zygote, 0)  # the zygote left with the run


async def test_a_killed_service_is_reported_and_restarts_appending_to_its_log(
    tmp_path: Path,
) -> None:
    sub = LocalSubstrate(tmp_path)
    try:
        first = await sub.start_service(_spec("decode", "d0"))  # no warm: the zygote starts now
        (tmp_path / "d0.log").write_text("first life\n")
        await sub.kill(first)
        assert await sub.exited(first) == "killed by SIGKILL"
        again = await sub.restart(first)
        assert again.url == first.url  # same ports
        assert await sub.exited(again) is None
    finally:
        await sub.stop_all()
    assert (tmp_path / "d0.log").read_text().startswith("first life\n")


async def test_a_service_that_cannot_start_fails_with_its_log(tmp_path: Path) -> None:
    sub = LocalSubstrate(tmp_path)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        try:
            with pytest.raises(UserError, match=r"p0 exited during start-up; see .*p0\.log"):
                await sub.start_service(_spec("prefill", "p0", port=port))
        finally:
            await sub.stop_all()
    assert "address already in use" in (tmp_path / "p0.log").read_text().lower()


async def test_services_die_with_their_zygote_and_are_reported_killed(tmp_path: Path) -> None:
    sub = LocalSubstrate(tmp_path)
    try:
        h = await sub.start_service(_spec("decode", "d0"))
        assert sub.zygote is not None
        os.kill(sub.zygote.proc.pid, signal.SIGKILL)
        code = await asyncio.wait_for(h.ref.proc.wait(), 10)  # type: ignore[attr-defined]
        assert code == -signal.SIGKILL
        assert await sub.exited(h) == "killed by SIGKILL"
        for _ in range(100):  # the kernel's death signal: gone within moments
            try:
                os.kill(h.ref.pid, 0)  # type: ignore[attr-defined]
            except ProcessLookupError:
                break
            await asyncio.sleep(0.05)
        else:
            pytest.fail("the service outlived its zygote")
        with pytest.raises(UserError, match="zygote"):
            await sub.start_service(_spec("decode", "d1"))
    finally:
        await sub.stop_all()
