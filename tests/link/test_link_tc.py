"""Kernel shaping on a veth pair between two namespaces (needs root and htb/tbf).

Every pair is created by a context manager or fixture that deletes its namespaces even when the
test fails. Traffic only runs between the namespaces this file creates.
"""

from __future__ import annotations

import asyncio
import http.client
import itertools
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from testbed.errors import UserError
from testbed.link import tc

pytestmark = [pytest.mark.tc, pytest.mark.timeout(90)]
MBIT = 1e6 / 8
_names = itertools.count()


@pytest.fixture
def root() -> None:
    if os.geteuid() != 0:
        pytest.skip("tc tests need root (network namespaces and qdiscs); run them as root")
    try:
        tc.check_available()
    except UserError as exc:
        pytest.skip(f"tc tests need root, ip and tc: {exc}")


@pytest.fixture
def pair(root: None) -> Iterator[tc.NetnsPair]:
    with tc.pair(f"{os.getpid()}-t{next(_names)}") as p:
        yield p


async def _server_in(p: tc.NetnsPair, side: str, factory) -> tuple[asyncio.AbstractServer, int]:  # type: ignore[no-untyped-def]
    s = p.socket_in(side)
    s.bind((p.addr_b if side == "b" else p.addr_a, 0))
    s.listen(16)
    s.setblocking(False)
    srv = await asyncio.get_running_loop().create_server(factory, sock=s)
    return srv, s.getsockname()[1]


async def _connect_from(p: tc.NetnsPair, side: str, addr: tuple[str, int]):  # type: ignore[no-untyped-def]
    s = p.socket_in(side)
    s.setblocking(False)
    await asyncio.wait_for(asyncio.get_running_loop().sock_connect(s, addr), 5)
    return await asyncio.open_connection(sock=s)


class _Count(asyncio.Protocol):
    def __init__(self, box: list[tuple[float, int]]) -> None:
        self.box = box

    def data_received(self, data: bytes) -> None:
        self.box.append((asyncio.get_running_loop().time(), len(data)))


async def _measure(p: tc.NetnsPair, addr: tuple[str, int], box, seconds: float) -> float:  # type: ignore[no-untyped-def]
    loop = asyncio.get_running_loop()
    _r, w = await _connect_from(p, "a", addr)
    buf = b"\0" * 65536
    t0 = loop.time()
    end = t0 + seconds
    while loop.time() < end:
        w.write(buf)
        try:
            await asyncio.wait_for(w.drain(), max(0.01, end - loop.time()))
        except TimeoutError:
            break
    w.transport.abort()
    lo, hi = t0 + 0.5, end
    return sum(n for t, n in box if lo <= t < hi) / (hi - lo)


async def test_pair_shapes_and_rate_changes_live(pair: tc.NetnsPair) -> None:
    pair.set_rate(20 * MBIT)
    box: list[tuple[float, int]] = []
    srv, port = await _server_in(pair, "b", lambda: _Count(box))
    try:
        # The kernel's shaping of one TCP flow wobbles by several % over short windows at low
        # rates; these checks are about the plumbing (rate set, changed live), not precision.
        got = await _measure(pair, (pair.addr_b, port), box, 2.0)
        assert got == pytest.approx(20 * MBIT, rel=0.08), got / MBIT
        box.clear()
        pair.set_rate(10 * MBIT, qdisc="htb")  # changed at run time
        got = await _measure(pair, (pair.addr_b, port), box, 2.0)
        assert got == pytest.approx(10 * MBIT, rel=0.08), got / MBIT
        assert "rate 10" in pair.show()
    finally:
        srv.close()


async def test_tbf(pair: tc.NetnsPair) -> None:
    pair.set_rate(20 * MBIT, qdisc="tbf")
    box: list[tuple[float, int]] = []
    srv, port = await _server_in(pair, "b", lambda: _Count(box))
    try:
        got = await _measure(pair, (pair.addr_b, port), box, 2.0)
        assert got == pytest.approx(20 * MBIT, rel=0.08), got / MBIT
    finally:
        srv.close()


def test_namespaces_are_deleted_even_on_failure(root: None) -> None:
    name = f"{os.getpid()}-t{next(_names)}"
    with pytest.raises(RuntimeError), tc.pair(name) as p:
        assert name in tc.list_pairs()
        raise RuntimeError("boom")
    assert name not in tc.list_pairs()
    assert p.ns_a not in subprocess.run(["ip", "netns", "list"], capture_output=True,
                                        text=True, check=True).stdout  # fmt: skip


def test_netem_is_reported(pair: tc.NetnsPair) -> None:
    if pair.has_netem():
        pair.set_delay(0.005)
        assert "netem" in pair.show()
    else:
        with pytest.raises(UserError, match="no netem"):
            pair.set_delay(0.005)


def _api(p: tc.NetnsPair, port: int, method: str, path: str, body: object) -> dict:  # type: ignore[type-arg]
    """One API call to an emulator that lives in namespace a (socket made inside it)."""
    s = p.socket_in("a")
    s.settimeout(5)
    s.connect(("127.0.0.1", port))
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    conn.sock = s
    try:
        conn.request(method, path, json.dumps(body), {"Content-Type": "application/json"})
        resp = conn.getresponse()
        data = resp.read()
        assert resp.status < 300, data
        return json.loads(data) if data else {}
    finally:
        conn.close()


async def test_kernel_bandwidth_with_emulator_latency(pair: tc.NetnsPair) -> None:
    """Bandwidth from the kernel (htb on the veth), latency from the emulator (in namespace a)."""
    pair.set_rate(20 * MBIT)
    root_dir = Path(__file__).resolve().parents[2]
    proc = subprocess.Popen(
        pair.exec_argv("a", [sys.executable, "-m", "testbed.cli", "link", "serve", "--port", "0"]),
        cwd=root_dir,
        stdout=subprocess.PIPE,
        text=True,
    )
    box: list[tuple[float, int]] = []
    srv, port = await _server_in(pair, "b", lambda: _Count(box))
    try:
        assert proc.stdout is not None
        line = await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), 20)
        m = re.search(r":(\d+)\s*$", line.strip())
        assert m, line
        api_port = int(m.group(1))
        p = _api(pair, api_port, "POST", "/proxies",
                 {"name": "xdc", "upstream": f"{pair.addr_b}:{port}"})  # fmt: skip
        _api(pair, api_port, "POST", "/proxies/xdc/toxics",
             {"type": "latency", "stream": "upstream", "attributes": {"latency": 100}})  # fmt: skip
        listen = ("127.0.0.1", int(p["listen"].rsplit(":", 1)[1]))
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        _r, w = await _connect_from(pair, "a", listen)
        w.write(b"first")
        for _ in range(500):
            if box:
                break
            await asyncio.sleep(0.01)
        assert box and box[0][0] - t0 >= 0.095  # the emulator's latency
        w.transport.abort()
        box.clear()
        got = await _measure(pair, listen, box, 2.5)
        assert got == pytest.approx(20 * MBIT, rel=0.08), got / MBIT  # the kernel's rate
    finally:
        srv.close()
        proc.terminate()
        proc.wait(10)
