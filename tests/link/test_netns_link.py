"""A run's kernel-shaped link (testbed.link.netns_link): the namespaces a `shaper: tc` run makes,
what its rate, cut and mend do to real traffic across the veth, the counters it reads, and the
cleanup of what a dead run left behind (at the next start and with `tc down --stale`).

Needs root, ip and tc with htb (this machine has them). Traffic runs only between the
namespaces these tests create; every test leaves `ip netns list` without its namespaces.
"""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
from collections.abc import Iterator

import pytest

from testbed.errors import UserError
from testbed.link import tc
from testbed.link.netns_link import NetnsLink, preflight
from testbed.transfer.netns import open_connection_in, socket_in_namespace

pytestmark = [pytest.mark.tc, pytest.mark.timeout(120)]


def _namespaces() -> set[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return {line.split()[0] for line in out.splitlines() if line.strip()}


def _class_rate(link: NetnsLink) -> float:
    """The htb class's rate on the shaped end, bytes/s, as the kernel reports it."""
    out = subprocess.run(
        ["tc", "-n", link.pair.ns_a, "class", "show", "dev", tc.DEV_A],
        capture_output=True,
        text=True,
    ).stdout
    m = re.search(r"htb 1:10 .*?rate (\d+(?:\.\d+)?)([KMG]?)bit", out)
    assert m, out
    return float(m.group(1)) * {"": 1, "K": 1e3, "M": 1e6, "G": 1e9}[m.group(2)] / 8


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


@pytest.fixture
def run_link() -> Iterator[NetnsLink]:
    link = NetnsLink.create(1e6)  # 8 Mbit/s of payload
    try:
        yield link
    finally:
        link.close()
    assert link.pair.ns_a not in _namespaces() and link.pair.ns_b not in _namespaces()


async def _sink_in_b(link: NetnsLink) -> tuple[asyncio.Server, int, list[int]]:
    """A server in the local side's namespace counting the bytes it receives."""
    got: list[int] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(65536):
            got.append(len(data))
        writer.close()

    sock = socket_in_namespace(link.listen_netns)
    sock.bind((link.listen_host, 0))
    sock.listen(8)
    sock.setblocking(False)
    server = await asyncio.start_server(handle, sock=sock)
    return server, sock.getsockname()[1], got


async def _push(link: NetnsLink, port: int, nbytes: int, within: float) -> bool:
    """Send `nbytes` from the PrfaaS side; whether the kernel took them all within `within`."""
    try:
        async with asyncio.timeout(within):
            _r, w = await open_connection_in(link.sender_netns, link.listen_host, port)
            w.write(b"\0" * nbytes)
            await w.drain()
            w.close()
            return True
    except (TimeoutError, OSError):
        return False


async def test_run_link_shapes_cuts_mends_and_counts(run_link: NetnsLink) -> None:
    link = run_link
    assert link.pair.ns_a == f"tbl-r{os.getpid()}-a" or link.pair.ns_a.startswith(
        f"tbl-r{os.getpid()}-"
    )
    assert {link.pair.ns_a, link.pair.ns_b} <= _namespaces()
    assert _class_rate(link) == pytest.approx(1e6 * tc.WIRE_PER_PAYLOAD, rel=1e-3)
    server, port, got = await _sink_in_b(link)
    try:
        before = await link.counters()
        assert await _push(link, port, 200_000, within=20)
        for _ in range(100):  # bounded: until the sink has it all (0.2 MB at 1 MB/s)
            if sum(got) >= 200_000:
                break
            await asyncio.sleep(0.05)
        assert sum(got) == 200_000
        after = await link.counters()
        assert after["bytes"] - before["bytes"] > 200_000  # payload plus headers
        assert after["rate"] == pytest.approx(1e6 * tc.WIRE_PER_PAYLOAD)

        await link.cut()
        got.clear()
        assert not await _push(link, port, 10_000, within=2)  # SYNs dropped: no connection
        assert sum(got) == 0
        dropped = (await link.counters())["drops"]
        assert dropped > after["drops"]

        await link.mend()
        await link.mend()  # idempotent
        assert (await link.counters())["drops"] >= dropped  # the cut's drops stay counted
        assert await _push(link, port, 10_000, within=20)

        await link.set_rate(2e6)
        assert link.rate == 2e6
        assert _class_rate(link) == pytest.approx(2e6 * tc.WIRE_PER_PAYLOAD, rel=1e-3)
    finally:
        server.close()
        await server.wait_closed()


def test_stale_namespaces_of_dead_runs_go_at_the_next_start() -> None:
    dead = f"r{_dead_pid()}"
    alive = f"r{os.getppid()}-77"  # pytest's parent: alive, and not ours to remove
    tc.create_pair(dead)
    tc.create_pair(alive)
    try:
        link = NetnsLink.create(1e6)
        try:
            assert set(link.removed_stale) >= {f"tbl-{dead}-a", f"tbl-{dead}-b"}
            assert f"tbl-{dead}-a" not in _namespaces()
            assert f"tbl-{alive}-a" in _namespaces()
        finally:
            link.close()
    finally:
        tc.teardown(dead)
        tc.teardown(alive)
    assert not {f"tbl-{dead}-a", f"tbl-{alive}-a", f"tbl-{alive}-b"} & _namespaces()


def test_tc_down_stale_removes_only_dead_runs() -> None:
    dead = f"r{_dead_pid()}"
    alive = f"r{os.getppid()}-78"
    tc.create_pair(dead)
    tc.create_pair(alive)
    try:
        out = subprocess.run(
            [sys.executable, "-m", "testbed.cli", "link", "tc", "down", "--stale"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert out.returncode == 0, out.stderr
        assert f"tbl-{dead}-a" in out.stdout and f"tbl-{alive}-a" not in out.stdout
        assert f"tbl-{dead}-a" not in _namespaces()
        assert f"tbl-{alive}-a" in _namespaces()
    finally:
        tc.teardown(dead)
        tc.teardown(alive)


def test_preflight_says_what_is_missing(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:  # type: ignore[no-untyped-def]
    assert preflight() is False  # this kernel: htb yes, netem no
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(UserError, match="needs root"):
        preflight()
    monkeypatch.undo()
    # A tc without sch_htb: every htb command fails as such a kernel's would.
    fake = tmp_path / "bin"
    fake.mkdir()
    real = subprocess.run(["which", "tc"], capture_output=True, text=True).stdout.strip()
    (fake / "tc").write_text(
        "#!/bin/sh\n"
        'case "$*" in *htb*) echo "Error: Specified qdisc kind is unknown." >&2; exit 2;; esac\n'
        f'exec {real} "$@"\n'
    )
    (fake / "tc").chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake}:{os.environ['PATH']}")
    with pytest.raises(UserError, match="sch_htb") as info:
        preflight()
    assert "\n" not in str(info.value)
    assert not any(ns.startswith(f"tbl-p{os.getpid()}") for ns in _namespaces())
