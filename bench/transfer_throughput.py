"""KV transfer throughput over loopback, and what checksums cost.

Prints MB/s for 1, 4 and 8 connections, sender -> receiver direct over 127.0.0.1 with checksums
on, with the receiver in its own process (as in the testbed, where prefill and decode instances
are separate processes), plus the CPU seconds each side spends per GB moved. Then the CPU cost of
each checksum algorithm per GB, which is why CRC32C is preferred when the `crc32c` package is
installed. Runs in well under a minute.

    .venv/bin/python bench/transfer_throughput.py [--mib-per-run 768] [--no-uvloop]
        [--report bench/reports/transfer.md]

`--report` writes what it prints as the report's `transfer_throughput` section, under its
provenance header (bench/provenance.py).
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import os
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from provenance import reported  # bench/: the script's directory is on sys.path

from testbed.transfer import ChecksumAlgo, KVReceiver, KVSender, PayloadSource, split_layers
from testbed.transfer.checksum import available_algos, checksum_fn

REQUEST_BYTES = 32 << 20  # one request: 32 MiB over 61 layers (the paper's model has 61)
LAYERS = 61
CONCURRENT = 4  # requests in flight at once, as several prefills stream at the same time


def _run(main: Awaitable[Any], use_uvloop: bool) -> Any:
    if use_uvloop:
        try:
            import uvloop

            return uvloop.run(main)  # type: ignore[arg-type]
        except ImportError:
            pass
    return asyncio.run(main)  # type: ignore[arg-type]


def _receiver_main(pipe: Connection, use_uvloop: bool) -> None:
    async def serve() -> None:
        async with KVReceiver() as rx:
            pipe.send(rx.port)
            while True:
                msg = await asyncio.to_thread(pipe.recv)
                if msg is None:
                    return
                for rid in msg:  # a receiver accepts frames only for ids it expects
                    rx.expect(rid)
                pipe.send("ready")
                cpu0 = time.process_time()
                before = rx.stats().bytes_received
                for rid in msg:
                    await rx.wait(rid, timeout=30)
                    rx.discard(rid)
                pipe.send((rx.stats().bytes_received - before, time.process_time() - cpu0))

    _run(serve(), use_uvloop)


@contextmanager
def receiver(use_uvloop: bool) -> Iterator[tuple[Connection, int]]:
    """A receiver in its own (spawned) process: the pipe that drives it (`_receiver_main`'s
    protocol) and its port; told to stop, and stopped, on the way out."""
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_receiver_main, args=(child, use_uvloop), daemon=True)
    proc.start()
    try:
        yield parent, parent.recv()
    finally:
        parent.send(None)
        proc.join(timeout=10)
        if proc.is_alive():
            proc.terminate()


async def _send_batch(
    port: int, connections: int, algo: ChecksumAlgo, ids: list[str], source: PayloadSource
) -> tuple[float, float]:
    sizes = split_layers(REQUEST_BYTES, LAYERS)
    async with KVSender("127.0.0.1", port, connections=connections, checksum=algo) as sender:
        await sender.wait_connected(5)
        sem = asyncio.Semaphore(CONCURRENT)

        async def one(rid: str) -> None:
            async with sem, sender.open(rid, sizes) as tx:
                for i, n in enumerate(sizes):
                    await tx.send_layer(i, source.layer(rid, i, n))
                await tx.finish(timeout=30)

        cpu0, t0 = time.process_time(), time.perf_counter()
        async with asyncio.TaskGroup() as tg:
            for rid in ids:
                tg.create_task(one(rid))
        return time.perf_counter() - t0, time.process_time() - cpu0


def throughput(
    connections: int,
    algo: ChecksumAlgo,
    total_bytes: int,
    pipe: Connection,
    port: int,
    source: PayloadSource,
    use_uvloop: bool,
) -> str:
    n = max(1, total_bytes // REQUEST_BYTES)
    ids = [f"c{connections}-{algo.name}-{i}-{time.monotonic_ns()}" for i in range(n)]
    pipe.send(ids)
    assert pipe.recv() == "ready"  # the receiver expects the ids before anything is sent
    wall, sender_cpu = _run(_send_batch(port, connections, algo, ids, source), use_uvloop)
    received, receiver_cpu = pipe.recv()
    assert received == n * REQUEST_BYTES, (received, n * REQUEST_BYTES)
    gb = received / 1e9
    return (
        f"{connections:>5} {algo.name:>7} {received / 2**20:>8.0f} {received / wall / 1e6:>9.0f}"
        f" {sender_cpu / gb:>14.2f} {receiver_cpu / gb:>16.2f}"
    )


def checksum_cost(algo: ChecksumAlgo, nbytes: int = 1 << 30) -> float:
    """CPU seconds per GB to checksum 256 KiB frames (the default chunk size)."""
    fn: Callable[[Any, int], int] = checksum_fn(algo)
    view = memoryview(os.urandom(256 << 10))
    reps = nbytes // len(view)
    cpu0 = time.process_time()
    for _ in range(reps):
        fn(view, 0)
    return (time.process_time() - cpu0) / (reps * len(view) / 1e9)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib-per-run", type=int, default=768)
    parser.add_argument("--no-uvloop", action="store_true")
    parser.add_argument("--report", type=Path, metavar="FILE", help="also write the output here")
    args = parser.parse_args()
    setup = f"loopback; --mib-per-run {args.mib_per_run}"
    heading = "Throughput and checksum cost (bench/transfer_throughput.py)"
    return reported(args.report, "transfer_throughput", heading, setup, lambda: measure(args))


def measure(args: argparse.Namespace) -> int:
    """Print the throughput table and each checksum's CPU per GB."""
    use_uvloop = not args.no_uvloop
    try:
        import uvloop  # noqa: F401
    except ImportError:
        use_uvloop = False

    algos = available_algos()
    best = ChecksumAlgo.CRC32C if ChecksumAlgo.CRC32C in algos else ChecksumAlgo.CRC32
    print(
        f"KV transfer over 127.0.0.1: {os.cpu_count()} CPUs, python {sys.version.split()[0]}, "
        f"{'uvloop' if use_uvloop else 'asyncio'} event loop, receiver in its own process, "
        f"{REQUEST_BYTES >> 20} MiB requests of {LAYERS} layers, {CONCURRENT} in flight, "
        "256 KiB frames"
    )
    source = PayloadSource(64 << 20, seed=0)
    with receiver(use_uvloop) as (parent, port):
        total = args.mib_per_run << 20
        print("conns    algo      MiB      MB/s  sender cpu s/GB  receiver cpu s/GB")
        runs = [(1, best), (4, best), (8, best), (4, ChecksumAlgo.CRC32), (4, ChecksumAlgo.NONE)]
        seen = set()
        for connections, algo in runs:
            if (connections, algo) in seen:
                continue
            seen.add((connections, algo))
            print(throughput(connections, algo, total, parent, port, source, use_uvloop))

    print("checksum CPU cost (256 KiB frames, paid once by the sender and once by the receiver):")
    for algo in algos:
        if algo == ChecksumAlgo.NONE:
            continue
        cost = checksum_cost(algo)
        print(f"  {algo.name:>7}: {cost:.3f} CPU s/GB ({1 / cost:.1f} GB/s)")
    if ChecksumAlgo.CRC32C not in algos:
        print("  CRC32C: unavailable (pip install crc32c)")
    print("(bench/transfer_cpu.py compares two checkouts' CPU per GB, interleaved)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
