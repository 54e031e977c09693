"""The local substrate's link (testbed.substrate.local + testbed.link.deployment): a real link
emulator process in front of a KV port, cut by `partition` and restored by `heal`, and removed
with the substrate. The Substrate protocol's `shape_link` is refused with one clear line."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import pytest

from testbed.config import LinkConfig, ScaleConfig
from testbed.errors import UserError
from testbed.substrate.local import LocalSubstrate

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
        with pytest.raises(UserError, match="#14"):
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
