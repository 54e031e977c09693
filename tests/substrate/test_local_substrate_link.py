"""The local substrate's link (testbed.substrate.local + testbed.link.deployment): a real link
emulator process in front of a KV port, cut by `partition` and restored by `heal`, and removed
with the substrate. With the emulator shaping, `shape_link` is refused with one clear line; with
`shaper: tc` the route is behind the run's kernel-shaped veth (root, marker tc)."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
from pathlib import Path

import pytest

from testbed.config import LinkConfig, ScaleConfig
from testbed.errors import UserError
from testbed.substrate.local import LocalSubstrate
from testbed.transfer.netns import open_connection_in

pytestmark = pytest.mark.timeout(120)


async def _echo_server() -> asyncio.Server:
    """A stand-in for a decode instance's KV receiver: echoes what it reads."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError):
            while data := await reader.read(4096):
                writer.write(data)
                await writer.drain()
        writer.close()

    return await asyncio.start_server(handle, "127.0.0.1", 0)


async def _round_trip(addr: tuple[str, int]) -> bytes:
    """Bytes echoed back through `addr`, b"" when the connection is refused or closed."""
    try:
        async with asyncio.timeout(10):
            reader, writer = await asyncio.open_connection(*addr)
            try:
                writer.write(b"kv-bytes")
                await writer.drain()
                return await reader.readexactly(8)
            finally:
                writer.close()
    except (OSError, asyncio.IncompleteReadError):
        return b""


async def test_partition_cuts_the_link_and_heal_restores_it(tmp_path: Path) -> None:
    server = await _echo_server()
    port = server.sockets[0].getsockname()[1]
    sub = LocalSubstrate(tmp_path / "logs")
    try:
        link = await sub.start_link(
            LinkConfig(),
            ScaleConfig(time_scale=20, byte_scale=2000),
            {"local-decode-0": ("127.0.0.1", port)},
            enabled=True,
            seed=3,
        )
        route = link.routes["local-decode-0"]
        assert route != ("127.0.0.1", port)  # senders go through the emulator's proxy
        assert sub.link_proc is not None and sub.link_proc.returncode is None
        assert await _round_trip(route) == b"kv-bytes"
        await sub.partition()
        assert await _round_trip(route) == b""
        await sub.heal()
        assert await _round_trip(route) == b"kv-bytes"
        await sub.heal()  # idempotent
        assert await _round_trip(route) == b"kv-bytes"
        with pytest.raises(UserError, match=r"link\.shaper: tc"):
            await sub.shape_link(12.5e6)
        proc = sub.link_proc
    finally:
        await sub.stop_all()
        server.close()
        await server.wait_closed()
    assert proc.returncode is not None  # the emulator went with the substrate
    assert sub.link is None and sub.link_proc is None
    assert (tmp_path / "logs" / "link.log").exists()


async def test_a_run_without_a_second_datacenter_has_nothing_to_partition(tmp_path: Path) -> None:
    sub = LocalSubstrate(tmp_path / "logs")
    try:
        link = await sub.start_link(
            LinkConfig(),
            ScaleConfig(),
            {"local-decode-0": ("127.0.0.1", 9)},
            enabled=False,
            seed=0,
        )
        assert link.routes == {"local-decode-0": ("127.0.0.1", 9)}
        assert sub.link_proc is None
        with pytest.raises(UserError, match="no link between datacenters"):
            await sub.partition()
        with pytest.raises(UserError, match="no link between datacenters"):
            await sub.heal()
    finally:
        await sub.stop_all()


def _namespaces() -> set[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return {line.split()[0] for line in out.splitlines() if line.strip()}


async def _round_trip_from(ns: str, addr: tuple[str, int]) -> bytes:
    """`_round_trip` from a socket in namespace `ns` (the PrfaaS side of the veth)."""
    try:
        async with asyncio.timeout(3):
            reader, writer = await open_connection_in(ns, *addr)
            try:
                writer.write(b"kv-bytes")
                await writer.drain()
                return await reader.readexactly(8)
            finally:
                writer.close()
    except (OSError, TimeoutError, asyncio.IncompleteReadError):
        return b""


@pytest.mark.tc
async def test_tc_shaper_puts_the_route_behind_the_kernel_shaped_veth(tmp_path: Path) -> None:
    server = await _echo_server()
    port = server.sockets[0].getsockname()[1]
    sub = LocalSubstrate(tmp_path / "logs")
    scale = ScaleConfig(time_scale=20, byte_scale=2000)
    try:
        link = await sub.start_link(
            LinkConfig(bandwidth="10Gbps", rtt="2ms", shaper="tc"),
            scale,
            {"local-decode-0": ("127.0.0.1", port)},
            enabled=True,
            seed=3,
        )
        assert sub.netns is not None and link.kernel is sub.netns and link.shaper == "tc"
        namespaces = {sub.netns.pair.ns_a, sub.netns.pair.ns_b}
        assert namespaces <= _namespaces()
        route = link.routes["local-decode-0"]
        assert route[0] == sub.netns.listen_host  # the proxy listens in the local side
        assert link.sender_netns == sub.netns.pair.ns_a
        # The kernel caps the link: the emulator's proxy has latency toxics, no bandwidth one.
        assert link.client is not None
        toxics = await link.client.toxics(link.proxies[0])
        assert {t["type"] for t in toxics} == {"latency"}
        assert sub.netns.rate == pytest.approx(link.to_wire(10e9 / 8))
        assert await _round_trip(route) == b""  # not reachable from this namespace
        assert await _round_trip_from(link.sender_netns, route) == b"kv-bytes"
        first = await link.sample()
        assert first is not None and first["shaper"] == "tc" and first["qdisc_bytes"] > 0

        await link.set_bandwidth(1e9 / 8)  # what the nemesis' bandwidth action calls
        assert sub.netns.rate == pytest.approx(link.to_wire(1e9 / 8))
        await sub.shape_link(2e6)  # wire bytes/s: the protocol's kernel shaping
        assert sub.netns.wire_rate == pytest.approx(2e6)

        await sub.partition()
        assert await _round_trip_from(link.sender_netns, route) == b""
        cut = await link.sample()
        assert cut is not None and cut["qdisc_drops"] > first["qdisc_drops"]
        await sub.heal()
        assert await _round_trip_from(link.sender_netns, route) == b"kv-bytes"
    finally:
        await sub.stop_all()
        server.close()
        await server.wait_closed()
    assert sub.netns is None and not namespaces & _namespaces()
