"""How much memory a decode instance's KV receiver gives a hostile local process (issue #12,
item 11): start a real decode service process, flood its KV port three ways, and print the
growth of its resident set (VmRSS) after each flood, with the receiver's own accounting.

    .venv/bin/python bench/receiver_flood.py [--engine emulated|torch] [--frames 100000]
        [--report bench/reports/transfer.md]   (section `receiver_flood-ENGINE`)

Floods (testbed.transfer.flood): (a) 1-byte DATA frames with unique ids; (b) one 1-byte frame
announcing a 256 MiB layer, for an unknown id and for an id the decode was told to expect (a
`POST /decode` with 256 MiB expected); (c) 10 connections whose headers promise 16 MiB each,
measured while they stall. Target: each flood grows RSS by less than 16 MiB. The torch decode
keeps payloads (it rebuilds the model's state from them), the emulated one does not.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
from provenance import reported  # bench/: the script's directory is on sys.path

from testbed.services.spec import ServiceSpec
from testbed.substrate.local import LocalService, start_service, stop_services
from testbed.transfer import flood

MIB = 1 << 20
TARGET = 16 * MIB


async def _stats(svc: LocalService) -> dict[str, Any]:
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as s,
        s.get(f"{svc.url}/stats") as resp,
    ):
        doc: dict[str, Any] = await resp.json()
        return doc


@contextlib.asynccontextmanager
async def _registered(svc: LocalService, wire_id: str, expected: int) -> AsyncIterator[None]:
    """A `POST /decode` that has registered `wire_id` (its first line read), held open."""
    body = {"id": wire_id, "output_tokens": 1, "expected_wire_bytes": expected}
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as s,
        s.post(f"{svc.url}/decode", json=body) as resp,
    ):
        try:
            line = await asyncio.wait_for(resp.content.readline(), 5)
        except TimeoutError:  # a decode from before the handshake says nothing until KV came
            line = b""
        if not line.startswith(b'{"expecting"'):
            print(f"  (decode did not register {wire_id!r}: {line[:60]!r})", file=sys.stderr)
        yield


def _row(name: str, before: int, after: int, stats: dict[str, Any], note: str) -> str:
    growth = after - before
    ok = "ok" if growth < TARGET else "OVER"
    held = stats.get("kv_payload_bytes", "-"), stats.get("kv_buffer_bytes", "-")
    return (
        f"{name:<34} {before / MIB:>8.1f} {after / MIB:>8.1f} {growth / MIB:>+8.1f} {ok:>4}"
        f"  tracked={stats.get('kv_requests_tracked', '-')} payload={held[0]} "
        f"buffers={held[1]} refused={stats.get('kv_frames_refused', '-')}  {note}"
    )


async def run(engine: str, frames: int) -> int:
    log_dir = Path(tempfile.mkdtemp(prefix="receiver-flood-"))
    spec = ServiceSpec(role="decode", id="flood-decode", engine=engine, kv_timeout_s=60)
    svc = await start_service(spec, log_dir)
    over = 0
    try:
        host, port, pid = spec.host, svc.ports["kv"], svc.pid
        print(f"decode ({engine}) pid {pid}, KV port {port}; VmRSS in MiB")
        print(f"{'flood':<34} {'before':>8} {'after':>8} {'growth':>8}")

        async def measure(name: str, coro: Any, note: str = "") -> None:
            nonlocal over
            await asyncio.sleep(0.5)
            before = flood.rss_bytes(pid)
            result = await coro
            await asyncio.sleep(0.5)
            after = flood.rss_bytes(pid)
            over += after - before >= TARGET
            acks = {k.name: v for k, v in result.items()} if isinstance(result, dict) else result
            print(_row(name, before, after, await _stats(svc), f"{note}{acks}"))

        await measure(f"(a) {frames} unique ids", flood.unique_ids(host, port, frames), "acks=")
        await measure("(b) 256 MiB layer, unknown id", flood.huge_layer(host, port), "acks=")
        async with _registered(svc, "bench-expected", 256 * MIB):
            await measure(
                "(b) 256 MiB layer, expected id",
                flood.huge_layer(host, port, request_id="bench-expected"),
                "acks=",
            )
        before = flood.rss_bytes(pid)
        async with flood.stalled_headers(host, port) as still_open:
            after = flood.rss_bytes(pid)
            stats = await _stats(svc)
        over += after - before >= TARGET
        print(_row("(c) 10 x 16 MiB headers, stalled", before, after, stats, f"open={still_open}"))
        print(json.dumps({"engine": engine, "floods_over_16MiB": over}))
    finally:
        await stop_services([svc])
    return 1 if over else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--engine", choices=("emulated", "torch"), default="emulated")
    ap.add_argument("--frames", type=int, default=100_000, help="frames of flood (a)")
    ap.add_argument("--report", type=Path, metavar="FILE", help="also write the output here")
    args = ap.parse_args()
    setup = f"local; one {args.engine} decode process, {args.frames} frames in flood (a)"
    heading = f"The receiver under a flood, {args.engine} decode (bench/receiver_flood.py)"
    return reported(
        args.report, f"receiver_flood-{args.engine}", heading, setup,
        lambda: asyncio.run(run(args.engine, args.frames)),
    )  # fmt: skip


if __name__ == "__main__":
    raise SystemExit(main())
