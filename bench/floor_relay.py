"""The floor for any user-space TCP relay on this host: the least a process can do to carry bytes
from one socket to another, to set the link emulator's CPU figures against (bench/link_cpu.py).

Why: issue #35 asked for the emulator's CPU per round trip and per GB cut by 30%. Most of what
is left is the kernel's loopback TCP, which any relay pays. This relay does nothing but that, so
its CPU is a bound: what no change to the emulator's own code can go below.

- `copy`: two threads, each a blocking `recv_into` then `sendall` of what came (the calls a
  message needs at the least; no event loop, no `epoll_wait`): the floor per round trip.
- `splice`: two threads, each `os.splice` socket -> pipe -> socket, blocking (no copy into the
  process at all), through a pipe of the emulator's size (1 MiB, the most an unprivileged
  process may set: a 64 KiB pipe costs about twice the CPU per GB): the floor per GB, the same
  kernel path as the emulator's splice thread without its poll and bookkeeping.

It serves one connection at a time to `HOST PORT`, prints its own listening port on stdout, and
runs until killed.

    python bench/floor_relay.py HOST PORT --mode copy|splice
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import os
import socket
import threading

PIPE = 1 << 20
"""Bytes one call moves at most, and the pipe's capacity (testbed.link.pipeline.splice's)."""
_F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031)


def copy(src: socket.socket, dst: socket.socket) -> None:
    """One direction by read and write: a message costs one recv and one send."""
    buf = memoryview(bytearray(PIPE))
    with contextlib.suppress(OSError):
        while k := src.recv_into(buf):
            dst.sendall(buf[:k])
    with contextlib.suppress(OSError):
        dst.shutdown(socket.SHUT_WR)


def splice(src: socket.socket, dst: socket.socket) -> None:
    """One direction in the kernel: socket -> pipe -> socket, the bytes never in the process."""
    r, w = os.pipe()
    with contextlib.suppress(OSError):  # above /proc/sys/fs/pipe-max-size: the default
        fcntl.fcntl(w, _F_SETPIPE_SZ, PIPE)
    try:
        with contextlib.suppress(OSError):
            while k := os.splice(src.fileno(), w, PIPE):
                while k:
                    k -= os.splice(r, dst.fileno(), k)
    finally:
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)
        for fd in (r, w):
            os.close(fd)


def serve(upstream: tuple[str, int], mode: str) -> None:
    pump = copy if mode == "copy" else splice
    ls = socket.create_server(("127.0.0.1", 0))
    print(ls.getsockname()[1], flush=True)
    while True:
        client, _ = ls.accept()
        server = socket.create_connection(upstream)
        for s in (client, server):
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        back = threading.Thread(target=pump, args=(server, client), daemon=True)
        back.start()
        pump(client, server)  # this thread carries the forward way
        back.join()
        client.close()
        server.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("host")
    parser.add_argument("port", type=int)
    parser.add_argument("--mode", choices=("copy", "splice"), default="splice")
    args = parser.parse_args()
    with contextlib.suppress(KeyboardInterrupt):
        serve((args.host, args.port), args.mode)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
