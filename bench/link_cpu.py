"""What the link emulator costs in CPU: µs per round trip with no toxics, and s per GB unshaped.

CPU, not wall: the machine is shared, and another job on a core stretches wall time far more than
the emulator's own CPU. Each figure is the emulator process's CPU (all its threads, ended ones
too: /proc/PID/stat, see cpu_ns) over a fixed amount of work:

- per round trip: 64-byte ping-pong through a proxy with no toxics to an echo server in its own
  process, `--rtts` round trips;
- per GB unshaped: `--mib` MiB pushed through a proxy with no toxics, one connection, by a
  blocking sender thread to a blocking sink thread (256 KiB sends, 1 MiB receives); the wall
  rate is printed beside raw loopback TCP measured the same way in the same round;
- per GB shaped (`--shaped MBIT`): the same through a `link_bandwidth` toxic, so the toxic
  path's cost is on record too;
- the floor: the same round trips and bytes through bench/floor_relay.py (blocking threads that
  only recv/send, or splice, and nothing else), in the same round: what any user-space relay
  pays the kernel here, so the share of the emulator's figure its own code could still save.

`--src DIR` (repeatable) also runs the emulator of another checkout (`testbed link serve` with
PYTHONPATH=DIR), interleaved with this one round by round, so a before/after pair sees the same
load; the median of `--repeat` rounds is printed per checkout.

    python bench/link_cpu.py [--repeat 5] [--src /tmp/before] [--report bench/reports/link.md]
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

from link_accuracy import (  # noqa: E402
    Pinger,
    api,
    echo_server,
    emulator_process,
    local_listener,
    make_proxy,
)
from provenance import checkout_table, provenance, write_section  # noqa: E402

SEND = memoryview(b"\0" * (256 * 1024))


def cpu_ns(pid: int) -> int:
    """CPU time of process `pid` so far, every thread's, those that have ended too, in ns.

    From /proc/PID/stat (utime + stime, in clock ticks: 10 ms here, so a figure wants a few
    hundred ms of work). Why not the threads' schedstat (ns): a connection's splice thread ends
    with its connection, and an ended thread leaves /proc/PID/task, so summing the live threads
    after a transfer lost the very thread that did the work, depending on whether it had exited
    yet (the floor relay's threads always had: negative figures).
    """
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    ticks = int(fields[11]) + int(fields[12])  # utime, stime: fields 14 and 15 of stat(5)
    return ticks * 1_000_000_000 // os.sysconf("SC_CLK_TCK")


def push(addr: tuple[str, int], listener: socket.socket, nbytes: int) -> float:
    """Send `nbytes` to `addr` and receive them on `listener`; the wall seconds it took."""
    got = [0]

    def sink() -> None:
        listener.settimeout(10)
        c, _ = listener.accept()
        c.settimeout(30)
        buf = memoryview(bytearray(1 << 20))
        with c:
            while got[0] < nbytes:
                k = c.recv_into(buf)
                if not k:
                    break
                got[0] += k

    t = threading.Thread(target=sink)
    t.start()
    t0 = time.perf_counter()
    with socket.create_connection(addr, timeout=30) as s:
        sent = 0
        while sent < nbytes:
            s.sendall(SEND)
            sent += len(SEND)
        t.join(60)
    wall = time.perf_counter() - t0
    if got[0] < nbytes:
        raise RuntimeError(f"sink got {got[0]} of {nbytes} bytes")
    return wall


@contextmanager
def floor_relay(upstream: tuple[str, int], mode: str) -> Iterator[tuple[int, int]]:
    """bench/floor_relay.py in its own process to `upstream`: its port and pid; always stopped."""
    cmd = [sys.executable, str(ROOT / "bench/floor_relay.py"), *map(str, upstream), "--mode", mode]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        yield int(proc.stdout.readline()), proc.pid
    finally:
        proc.kill()
        proc.wait(10)


def rtt_cpu_us(port: int, pid: int, rtts: int) -> float:
    """`pid`'s CPU µs per 64-byte round trip through 127.0.0.1:`port`."""
    p = Pinger(("127.0.0.1", port))
    c0 = cpu_ns(pid)
    for _ in range(rtts):
        p.rtt()
    used = (cpu_ns(pid) - c0) / 1e3 / rtts
    p.close()
    return used


def measure_floor(echo: tuple[str, int], args: argparse.Namespace) -> dict[str, float]:
    """The floor relay's CPU for the same round trips and bytes as `measure`."""
    out: dict[str, float] = {}
    with floor_relay(echo, "copy") as (port, pid):
        out["floor_rtt_us"] = rtt_cpu_us(port, pid, args.rtts)
    nbytes = args.mib << 20
    ls = local_listener()
    with floor_relay(ls.getsockname(), "splice") as (port, pid):
        c0 = cpu_ns(pid)
        push(("127.0.0.1", port), ls, nbytes)
        out["floor_s_per_gb"] = (cpu_ns(pid) - c0) / 1e9 / (nbytes / 1e9)
    ls.close()
    return out


def measure(
    url: str, pid: int, echo: tuple[str, int], args: argparse.Namespace
) -> dict[str, float]:
    """One round of every figure against one emulator."""
    out: dict[str, float] = {}
    out["rtt_us"] = rtt_cpu_us(make_proxy(url, "cpu-rtt", echo), pid, args.rtts)
    api(url, "DELETE", "/proxies/cpu-rtt")

    nbytes = args.mib << 20
    ls = local_listener()
    port = make_proxy(url, "cpu-bulk", ls.getsockname())
    c0 = cpu_ns(pid)
    wall = push(("127.0.0.1", port), ls, nbytes)
    out["s_per_gb"] = (cpu_ns(pid) - c0) / 1e9 / (nbytes / 1e9)
    out["mb_s"] = nbytes / wall / 1e6
    api(url, "DELETE", "/proxies/cpu-bulk")
    ls.close()
    ls = local_listener()
    out["raw_mb_s"] = nbytes / push(ls.getsockname(), ls, nbytes) / 1e6
    ls.close()

    if args.shaped:
        ls = local_listener()
        port = make_proxy(url, "cpu-shaped", ls.getsockname())
        api(url, "POST", "/proxies/cpu-shaped/toxics", {
            "type": "link_bandwidth", "stream": "upstream",
            "attributes": {"rate": args.shaped * 1e6 / 8 / 1000},
        })  # fmt: skip
        shaped = min(nbytes, int(args.shaped * 1e6 / 8 * 2))  # about 2 s of link time
        c0 = cpu_ns(pid)
        push(("127.0.0.1", port), ls, shaped)
        out["shaped_s_per_gb"] = (cpu_ns(pid) - c0) / 1e9 / (shaped / 1e9)
        api(url, "DELETE", "/proxies/cpu-shaped")
        ls.close()
    return out | measure_floor(echo, args)


def run(args: argparse.Namespace) -> dict[str, list[dict[str, float]]]:
    """`--repeat` rounds, each measuring every checkout in turn (interleaved)."""
    srcs = [ROOT, *(Path(s).resolve() for s in args.src)]
    results: dict[str, list[dict[str, float]]] = {str(s): [] for s in srcs}
    with echo_server() as echo:
        for r in range(args.repeat):
            order = srcs if r % 2 == 0 else srcs[::-1]  # alternate who goes first
            for src in order:
                with emulator_process(src) as (url, pid):
                    results[str(src)].append(measure(url, pid, echo, args))
                print(f"round {r + 1} {src}: {results[str(src)][-1]}", file=sys.stderr)
    return results


FIGURES = {
    "rtt_us": ("CPU µs per round trip, no toxics", "{:.1f}"),
    "s_per_gb": ("CPU s per GB unshaped (1 conn)", "{:.3f}"),
    "mb_s": ("unshaped wall MB/s", "{:.0f}"),
    "raw_mb_s": ("raw loopback wall MB/s, same round", "{:.0f}"),
    "of_raw": ("unshaped / raw loopback (median of per-round ratios)", "{:.0%}"),
    "shaped_s_per_gb": ("CPU s per GB through link_bandwidth", "{:.3f}"),
    "floor_rtt_us": ("floor relay: CPU µs per round trip (recv + send threads)", "{:.1f}"),
    "floor_s_per_gb": ("floor relay: CPU s per GB (splice threads)", "{:.3f}"),
    "rtt_over_floor": ("round trip: emulator / floor (median of per-round ratios)", "{:.2f}x"),
    "gb_over_floor": ("per GB: emulator / floor (median of per-round ratios)", "{:.2f}x"),
}
"""Figure key -> (label, format), in the table's order (provenance.checkout_table)."""


def add_ratios(results: dict[str, list[dict[str, float]]]) -> None:
    """Each round's ratios (against raw loopback and the floor), from its own figures."""
    for runs in results.values():
        for r in runs:
            r["of_raw"] = r["mb_s"] / r["raw_mb_s"]
            r["rtt_over_floor"] = r["rtt_us"] / r["floor_rtt_us"]
            r["gb_over_floor"] = r["s_per_gb"] / r["floor_s_per_gb"]


def table(results: dict[str, list[dict[str, float]]]) -> str:
    add_ratios(results)
    return "\n".join(checkout_table(results, FIGURES))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--rtts", type=int, default=20000)
    parser.add_argument("--mib", type=int, default=1024)
    parser.add_argument("--shaped", type=float, default=0.0, help="also a shaped run (Mbit/s)")
    parser.add_argument("--src", action="append", default=[], help="another checkout to run")
    parser.add_argument("--report", type=Path, help="replace this file's link_cpu section")
    args = parser.parse_args()
    load = os.getloadavg()
    results = run(args)
    body = table(results)
    head = provenance(
        "bench/link_cpu.py",
        sys.argv[1:],
        load,
        "the link emulator as its own process (`testbed link serve`, uvloop), no toxics, "
        f"loopback; median of {args.repeat} interleaved rounds",
    )
    text = f"{head}\n{body}\n"
    print(text)
    if args.report is not None:
        write_section(args.report, "link_cpu", "CPU per round trip and per GB", text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
