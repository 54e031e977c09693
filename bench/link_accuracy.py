"""How faithful is the link emulator? Configured vs achieved bandwidth, added latency, jitter,
and unshaped throughput against raw loopback TCP, all measured in one run.

    python bench/link_accuracy.py            (about 2 minutes on 2 cores)
    python bench/link_accuracy.py --report bench/reports/link.md   (section `link_accuracy`)

The emulator runs as its own process (`testbed link serve`), as in the testbed's local
substrate. Traffic comes from blocking sockets in threads of this process (they release the GIL
while in the kernel), the same tools for every row, so rows are comparable. The kernel (tc) rows
need root: they shape a veth pair between two namespaces this script creates and always deletes.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager, suppress
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from provenance import commit, load_text, reported  # noqa: E402

from testbed.errors import UserError  # noqa: E402

RATES_MBIT = (1, 10, 100, 1000)
CONNS = (1, 8)
WARMUP = {1: 0.6, 10: 0.5, 100: 0.4, 1000: 0.4}  # seconds before the window opens
WINDOW = {1: 3.0, 10: 2.0, 100: 1.5, 1000: 1.5}  # measurement window (seconds)
SEND_BUF = b"\0" * (256 * 1024)
IO_TIMEOUT = 0.5  # socket timeout so every thread notices the stop flag quickly


# -- the emulator process and its API --------------------------------------------------------
EMULATOR_PID: list[int] = []
"""The running emulator's pid (section 5 reads its CPU time)."""


@contextmanager
def emulator_process(src: Path = ROOT) -> Iterator[tuple[str, int]]:
    """`testbed link serve --port 0` from checkout `src` (on PYTHONPATH); yields its API URL
    and pid; always stops it."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "testbed.cli", "link", "serve", "--port", "0", "--seed", "1"],
        cwd=src,
        env=dict(os.environ, PYTHONPATH=str(src)),
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        m = re.search(r"(http://\S+)", line)
        if not m:
            raise RuntimeError(f"emulator from {src} did not start: {line!r}")
        yield m.group(1), proc.pid
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()


@contextmanager
def emulator() -> Iterator[str]:
    """This checkout's emulator (emulator_process); its pid in EMULATOR_PID while it runs."""
    with emulator_process() as (url, pid):
        EMULATOR_PID[:] = [pid]
        try:
            yield url
        finally:
            EMULATOR_PID.clear()


def api(url: str, method: str, path: str, body: object = None) -> object:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url + path, data=data, method=method)
    req.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(req, timeout=10) as resp:
        raw = resp.read()
    return json.loads(raw) if raw.strip() else None


def make_proxy(url: str, name: str, upstream: tuple[str, int]) -> int:
    p = api(url, "POST", "/proxies", {"name": name, "upstream": f"{upstream[0]}:{upstream[1]}"})
    assert isinstance(p, dict)
    return int(p["listen"].rsplit(":", 1)[1])


# -- traffic -----------------------------------------------------------------------------------
class Counter:
    """Bytes received by sink threads (one slot per connection)."""

    def __init__(self, n: int) -> None:
        self.slots = [0] * n

    def total(self) -> int:
        return sum(self.slots)


def _sink(listener: socket.socket, counter: Counter, n: int, stop: threading.Event) -> None:
    listener.settimeout(IO_TIMEOUT)
    conns: list[socket.socket] = []
    deadline = time.monotonic() + 10
    while len(conns) < n and time.monotonic() < deadline and not stop.is_set():
        with suppress(TimeoutError):
            c, _ = listener.accept()
            conns.append(c)

    def drain(i: int, c: socket.socket) -> None:
        buf = memoryview(bytearray(1 << 20))
        c.settimeout(IO_TIMEOUT)
        while not stop.is_set():
            try:
                k = c.recv_into(buf)
            except TimeoutError:
                continue
            except OSError:
                break
            if not k:
                break
            counter.slots[i] += k
        c.close()

    with ThreadPoolExecutor(max(1, len(conns))) as pool:  # one thread a connection
        list(pool.map(drain, range(len(conns)), conns))


def _source(sock: socket.socket, stop: threading.Event) -> None:
    sock.settimeout(IO_TIMEOUT)
    mv = memoryview(SEND_BUF)
    with sock, suppress(OSError):  # a reset ends the source; the socket is closed either way
        while not stop.is_set():
            try:
                sock.send(mv)
            except TimeoutError:
                continue


def throughput(
    listener: socket.socket,
    connect: Callable[[], socket.socket],
    n: int,
    warmup: float,
    window: float,
) -> float:
    """Bytes/s received over `window` seconds, after `warmup`, with n parallel connections."""
    stop = threading.Event()
    counter = Counter(n)
    sink = threading.Thread(target=_sink, args=(listener, counter, n, stop))
    sink.start()
    sources = []
    try:
        for _ in range(n):
            s = connect()
            t = threading.Thread(target=_source, args=(s, stop))
            t.start()
            sources.append(t)
        time.sleep(warmup)
        b0, t0 = counter.total(), time.perf_counter()
        time.sleep(window)
        b1, t1 = counter.total(), time.perf_counter()
    finally:
        stop.set()
        for t in sources:
            t.join(5)
        sink.join(5)
    return (b1 - b0) / (t1 - t0)


def local_listener() -> socket.socket:
    ls = socket.socket()
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind(("127.0.0.1", 0))
    ls.listen(64)
    return ls


def tcp_connect(addr: tuple[str, int]) -> Callable[[], socket.socket]:
    return lambda: socket.create_connection(addr, timeout=5)


# -- ping-pong latency -------------------------------------------------------------------------
ECHO_SERVER = r"""
import socket, sys, threading
ls = socket.socket()
ls.bind(("127.0.0.1", 0))
ls.listen(16)
print(ls.getsockname()[1], flush=True)
def echo(c):
    c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    while True:
        try:
            d = c.recv(65536)
        except OSError:
            break
        if not d:
            break
        c.sendall(d)
    c.close()
while True:
    c, _ = ls.accept()
    threading.Thread(target=echo, args=(c,), daemon=True).start()
"""


@contextmanager
def echo_server() -> Iterator[tuple[str, int]]:
    """An echo server in its own process, so its GIL is not ours (ping-pong timing)."""
    proc = subprocess.Popen([sys.executable, "-c", ECHO_SERVER], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        yield ("127.0.0.1", int(proc.stdout.readline()))
    finally:
        proc.kill()
        proc.wait(10)


class Pinger:
    """One connection for 64-byte ping-pong round trips."""

    def __init__(self, addr: tuple[str, int], size: int = 64) -> None:
        self.sock = socket.create_connection(addr, timeout=5)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.msg = b"x" * size
        for _ in range(20):  # warm the path
            self.rtt()

    def rtt(self) -> float:
        t0 = time.perf_counter()
        self.sock.sendall(self.msg)
        _recv_exact(self.sock, len(self.msg))
        return time.perf_counter() - t0

    def close(self) -> None:
        self.sock.close()


def interleaved_rtts(a: Pinger, b: Pinger, n: int) -> tuple[list[float], list[float]]:
    """n round trips on each path, alternating, so background load hits both alike."""
    xs, ys = [], []
    for _ in range(n):
        xs.append(a.rtt())
        ys.append(b.rtt())
    return xs, ys


def _recv_exact(s: socket.socket, n: int) -> None:
    got = 0
    while got < n:
        d = s.recv(n - got)
        if not d:
            raise ConnectionError("peer closed")
        got += len(d)


def pct(xs: list[float], q: float) -> float:
    ys = sorted(xs)
    return ys[min(len(ys) - 1, max(0, round(q / 100 * (len(ys) - 1))))]


# -- sections ----------------------------------------------------------------------------------
def bandwidth_emulator(url: str) -> dict[tuple[int, int], float]:
    out = {}
    for mbit in RATES_MBIT:
        for n in CONNS:
            ls = local_listener()
            name = f"bw{mbit}x{n}"
            port = make_proxy(url, name, ls.getsockname())
            api(url, "POST", f"/proxies/{name}/toxics", {
                "type": "link_bandwidth", "stream": "upstream",
                "attributes": {"rate": mbit * 1e6 / 8 / 1000},
            })  # fmt: skip
            rate = throughput(ls, tcp_connect(("127.0.0.1", port)), n, WARMUP[mbit], WINDOW[mbit])
            api(url, "DELETE", f"/proxies/{name}")
            ls.close()
            out[(mbit, n)] = rate * 8 / 1e6
    return out


def bandwidth_tc(qdisc: str) -> dict[tuple[int, int], float]:
    from testbed.link import tc

    out = {}
    with tc.pair(f"{os.getpid()}-bench", rate=1e6 / 8, qdisc=qdisc) as p:
        for mbit in RATES_MBIT:
            p.set_rate(mbit * 1e6 / 8, qdisc=qdisc)
            for n in CONNS:
                ls = p.socket_in("b")
                ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                ls.bind((p.addr_b, 0))
                ls.listen(64)
                addr = ls.getsockname()

                def connect(addr: tuple[str, int] = addr) -> socket.socket:
                    s = p.socket_in("a")
                    s.settimeout(5)
                    s.connect(addr)
                    return s

                # One kernel-shaped TCP flow wobbles over short windows at low rates: measure
                # the kernel a little longer there.
                window = WINDOW[mbit] + (1.0 if mbit <= 10 else 0.0)
                rate = throughput(ls, connect, n, WARMUP[mbit] + 0.3, window)
                ls.close()
                out[(mbit, n)] = rate * 8 / 1e6
    return out


def report_latency(direct: list[float], proxied: list[float], jittered: list[float]) -> None:
    ms = 1e3
    d50, d99 = pct(direct, 50) * ms, pct(direct, 99) * ms
    p50, p99 = pct(proxied, 50) * ms, pct(proxied, 99) * ms
    print("\n2. Latency added with no toxics (64-byte ping-pong round trips, n=2000 each,")
    print("   direct and through the emulator alternating)")
    print(f"   direct loopback     p50 {d50:.3f} ms   p99 {d99:.3f} ms")
    print(f"   through emulator    p50 {p50:.3f} ms   p99 {p99:.3f} ms")
    print(f"   added per round trip p50 {p50 - d50:.3f} ms   p99 {p99 - d99:.3f} ms")

    extra = [(x - pct(proxied, 50)) * ms for x in jittered]
    print("\n3. Latency + jitter: toxic latency=10 ms, jitter=4 ms (downstream), n=400")
    print("   configured: uniform on [6, 14] ms: mean 10.00, std 2.31, min 6.00, max 14.00")
    print(
        f"   measured:   mean {statistics.fmean(extra):.2f}, std {statistics.pstdev(extra):.2f},"
        f" min {min(extra):.2f}, max {max(extra):.2f}, p1 {pct(extra, 1):.2f},"
        f" p50 {pct(extra, 50):.2f}, p99 {pct(extra, 99):.2f} ms"
    )


def footer(load: tuple[float, ...], started: float) -> None:
    """The load average before and after, the commit, and how long the bench took."""
    after = load_text(os.getloadavg())
    print(f"\nload average before {load_text(load)}, after {after}; commit {commit()}")
    print(f"\nbench time {time.perf_counter() - started:.0f} s")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--latency-only", action="store_true", help="run only sections 2 and 3 (a few seconds)"
    )
    parser.add_argument("--report", type=Path, metavar="FILE", help="also write the output here")
    args = parser.parse_args()
    setup = "local; the emulator process, loopback sockets" + (
        "" if args.latency_only else ", tc htb and tbf on a veth between two namespaces"
    )
    heading = "Emulator and tc accuracy (bench/link_accuracy.py)"
    return reported(args.report, "link_accuracy", heading, setup, lambda: measure(args))


def measure(args: argparse.Namespace) -> int:
    """Run every section and print the report."""
    started = time.perf_counter()
    load = os.getloadavg()
    print("Link emulator accuracy (bench/link_accuracy.py)")
    print(f"host: {os.cpu_count()} CPUs, python {sys.version.split()[0]}\n")
    with emulator() as url, echo_server() as echo:
        bw_emu = {} if args.latency_only else bandwidth_emulator(url)

        # Latency added with no toxics: ping-pong round trips, direct and through a proxy.
        port = make_proxy(url, "lat", echo)
        direct_p, proxied_p = Pinger(echo), Pinger(("127.0.0.1", port))
        direct, proxied = interleaved_rtts(direct_p, proxied_p, 2000)
        # Latency + jitter: 10 ms +/- 4 ms on the downstream direction.
        api(url, "POST", "/proxies/lat/toxics", {
            "type": "latency", "stream": "downstream",
            "attributes": {"latency": 10, "jitter": 4},
        })  # fmt: skip
        jittered = [proxied_p.rtt() for _ in range(400)]
        direct_p.close()
        proxied_p.close()
        api(url, "DELETE", "/proxies/lat")

        # Unshaped throughput: raw loopback TCP vs through the emulator, same tools, same run.
        raw_runs, emu_runs = [], []
        for _ in range(0 if args.latency_only else 2):
            ls = local_listener()
            raw_runs.append(throughput(ls, tcp_connect(ls.getsockname()), 1, 0.3, 2.0))
            ls.close()
            ls = local_listener()
            port = make_proxy(url, "raw", ls.getsockname())
            emu_runs.append(throughput(ls, tcp_connect(("127.0.0.1", port)), 1, 0.3, 2.0))
            api(url, "DELETE", "/proxies/raw")
            ls.close()
        # The emulator's own CPU: µs per round trip and s per GB (bench/link_cpu.py's round).
        cpu = None
        if not args.latency_only:
            from link_cpu import measure

            opts = argparse.Namespace(rtts=2000, mib=512, shaped=0.0)
            cpu = measure(url, EMULATOR_PID[0], echo, opts)

    tc_rows: dict[str, dict[tuple[int, int], float]] = {}
    tc_note = ""
    try:
        from testbed.link import tc

        if args.latency_only:
            raise UserError("--latency-only")
        tc.check_available()
        for qdisc in ("htb", "tbf"):
            tc_rows[qdisc] = bandwidth_tc(qdisc)
    except UserError as exc:
        tc_note = f"tc rows skipped: {exc}"

    # -- report ---------------------------------------------------------------------------------
    if args.latency_only:
        report_latency(direct, proxied, jittered)
        return 0
    print("1. Bandwidth: configured vs achieved (Mbit/s; error in %)")
    head = f"{'configured':>10} {'conns':>5} | {'emulator':>9} {'err':>6}"
    for qdisc in tc_rows:
        head += f" | {'tc ' + qdisc:>9} {'err':>6}"
    print(head)
    print("-" * len(head))
    worst = 0.0
    for mbit in RATES_MBIT:
        for n in CONNS:
            got = bw_emu[(mbit, n)]
            err = (got - mbit) / mbit * 100
            worst = max(worst, abs(err))
            row = f"{mbit:>10} {n:>5} | {got:>9.2f} {err:>+5.1f}%"
            for rows in tc_rows.values():
                g = rows[(mbit, n)]
                row += f" | {g:>9.2f} {(g - mbit) / mbit * 100:>+5.1f}%"
            print(row)
    print(f"emulator worst |error|: {worst:.2f}%  (link_bandwidth toxic, shared by all conns)")
    if tc_note:
        print(tc_note)

    report_latency(direct, proxied, jittered)

    raw, emu = max(raw_runs), max(emu_runs)
    print("\n4. Unshaped throughput, 1 connection (best of 2 windows of 2 s)")
    print(f"   raw loopback TCP   {raw * 8 / 1e9:.2f} Gbit/s")
    print(f"   through emulator   {emu * 8 / 1e9:.2f} Gbit/s  ({emu / raw * 100:.0f}% of raw)")
    if cpu is not None:
        print("\n5. The emulator process's CPU (all threads; bench/link_cpu.py compares checkouts)")
        print(f"   per round trip, no toxics   {cpu['rtt_us']:.1f} µs (2,000 64-byte round trips)")
        print(f"   per GB unshaped, 1 conn     {cpu['s_per_gb']:.3f} s (512 MiB)")
    footer(load, started)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
