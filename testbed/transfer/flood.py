"""Hostile-sender floods against a KV receiver, for bench/receiver_flood.py and the tests.

Any local process can connect to a decode instance's KV port. These are the three floods of
issue #12 (item 11) that used to make a receiver hold memory it never gave back:

- `unique_ids`: many 1-byte DATA frames, each for a different made-up request id;
- `huge_layer`: one 1-byte DATA frame that announces a 256 MiB layer;
- `stalled_headers`: connections whose frame headers promise 16 MiB, then nothing more.

Each returns once the receiver has answered (or, for the stalled headers, holds the connections
open until the caller closes them), so a measurement taken right after sees the receiver's state.
Loopback only; every wait is bounded.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

from testbed.transfer.wire import AckFrame, AckStatus, DataFrame, encode_frame, read_frame

__all__ = ["huge_layer", "rss_bytes", "stalled_headers", "unique_ids"]

MIB = 1 << 20


def rss_bytes(pid: int) -> int:
    """Resident set size of a process, from /proc/PID/status (VmRSS)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS in /proc/{pid}/status")


async def _acks(reader: asyncio.StreamReader, n: int, timeout: float) -> dict[AckStatus, int]:
    """Read `n` ACKs (or until EOF); counts by status."""
    counts: dict[AckStatus, int] = {}
    async with asyncio.timeout(timeout):
        for _ in range(n):
            frame = await read_frame(reader)
            if frame is None:
                break
            if isinstance(frame, AckFrame):
                counts[frame.status] = counts.get(frame.status, 0) + 1
    return counts


async def unique_ids(
    host: str, port: int, n: int, *, prefix: str = "flood", timeout: float = 120.0
) -> dict[AckStatus, int]:
    """Flood (a): `n` 1-byte DATA frames with unique ids over one connection; the ACKs by
    status (read while sending, so the receiver never stalls on its writes)."""
    reader, writer = await asyncio.open_connection(host, port)
    try:
        acks = asyncio.create_task(_acks(reader, n, timeout))
        batch: list[bytes] = []
        for i in range(n):
            head, body = encode_frame(DataFrame(f"{prefix}-{i}", 0, 0, 1, b"x"))
            batch += (head, bytes(body))
            if len(batch) >= 2048:
                writer.writelines(batch)
                batch.clear()
                await writer.drain()
        writer.writelines(batch)
        await writer.drain()
        return await acks
    finally:
        writer.close()


async def huge_layer(
    host: str, port: int, *, request_id: str = "huge", layer_bytes: int = 256 * MIB
) -> dict[AckStatus, int]:
    """Flood (b): one 1-byte frame announcing a `layer_bytes` layer; its ACK by status."""
    reader, writer = await asyncio.open_connection(host, port)
    try:
        head, body = encode_frame(DataFrame(request_id, 0, 0, layer_bytes, b"x"))
        writer.writelines((head, bytes(body)))
        await writer.drain()
        return await _acks(reader, 1, 30.0)
    finally:
        writer.close()


@contextlib.asynccontextmanager
async def stalled_headers(
    host: str, port: int, *, connections: int = 10, promise: int = 16 * MIB
) -> AsyncIterator[int]:
    """Flood (c): `connections` connections each send a header promising `promise` payload
    bytes (and the request id), then stall; held open for the `async with` body, which gets
    how many connections are still open when it starts."""
    payload = memoryview(bytearray(promise))  # only the header is sent
    writers: list[asyncio.StreamWriter] = []
    readers: list[asyncio.StreamReader] = []
    try:
        for i in range(connections):
            reader, writer = await asyncio.open_connection(host, port)
            head, _ = encode_frame(DataFrame(f"stall-{i}", 0, 0, promise, payload))
            writer.write(head)
            await writer.drain()
            writers.append(writer)
            readers.append(reader)
        await asyncio.sleep(0.5)  # let the receiver read what was sent
        yield sum(1 for r in readers if not r.at_eof())
    finally:
        for w in writers:
            w.close()
